// The entries of the tb_runtime table (see include/torchbridge/sdk/runtime.h for their contract),
// one translation unit per group: devices, memory, streams, events.
#pragma once

#include <cstddef>
#include <cstdint>

#include "torchbridge/sdk/runtime.h"

namespace torchbridge::cuda_device {

// cuda_device_entries.cpp
tb_status device_count(void* context, int32_t* count);
tb_status set_device(void* context, int32_t device);
tb_status get_device(void* context, int32_t* device);
tb_status device_properties(void* context, int32_t device, tb_device_properties* properties);
tb_status device_synchronize(void* context, int32_t device);

// cuda_memory_entries.cpp
tb_status device_malloc(void* context, int32_t device, size_t bytes, void** pointer);
tb_status device_free(void* context, int32_t device, void* pointer);
tb_status host_malloc(void* context, size_t bytes, void** pointer);
tb_status host_free(void* context, void* pointer);
tb_status memcpy_sync(void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind);
tb_status memcpy_async(void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind,
                       tb_stream stream);
tb_status memset_async(void* context, void* dst, int32_t value, size_t bytes, tb_stream stream);

// cuda_stream_entries.cpp
tb_status stream_create(void* context, int32_t device, int32_t priority, tb_stream* stream);
tb_status stream_destroy(void* context, tb_stream stream);
tb_status stream_query(void* context, tb_stream stream);
tb_status stream_synchronize(void* context, tb_stream stream);
tb_status stream_wait_event(void* context, tb_stream stream, tb_event event);

// cuda_event_entries.cpp
tb_status event_create(void* context, int32_t device, int32_t enable_timing, tb_event* event);
tb_status event_destroy(void* context, tb_event event);
tb_status event_record(void* context, tb_event event, tb_stream stream);
tb_status event_query(void* context, tb_event event);
tb_status event_synchronize(void* context, tb_event event);
tb_status event_elapsed_time(void* context, tb_event start, tb_event end, float* milliseconds);

}  // namespace torchbridge::cuda_device

// The emulated runtime: every tb_runtime entry as a member function. entry.cpp turns these into
// the C table; this class holds the state they share (devices, host allocations, streams, events,
// fault injection) and does all argument validation and error reporting.
#pragma once

#include "emu_device.h"
#include "event.h"
#include "fault_injector.h"
#include "handle_registry.h"
#include "host_allocations.h"
#include "options.h"
#include "stream.h"
#include "transfer.h"

#include <torchbridge/sdk/runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace torchbridge::emu {

class EmuRuntime {
 public:
  // nullptr with `error` set when a device's memory cannot be created.
  static std::unique_ptr<EmuRuntime> create(const EmuOptions& options, std::string& error);

  // Devices
  tb_status device_count(int32_t* count) const;
  tb_status set_device(int32_t device);
  tb_status get_device(int32_t* device) const;
  tb_status device_properties(int32_t device, tb_device_properties* properties) const;
  tb_status device_synchronize(int32_t device);

  // Memory
  tb_status device_malloc(int32_t device, size_t bytes, void** pointer);
  tb_status device_free(int32_t device, void* pointer);
  tb_status host_malloc(size_t bytes, void** pointer);
  tb_status host_free(void* pointer);
  // `kind` arrives as a plain int (entry.cpp): a C caller may pass any value, and only after
  // validation is it a tb_memcpy_kind.
  tb_status memcpy_sync(void* destination, const void* source, size_t bytes, int kind);
  tb_status memcpy_async(void* destination, const void* source, size_t bytes, int kind, tb_stream stream);
  tb_status memset_async(void* destination, int32_t value, size_t bytes, tb_stream stream);

  // Streams
  tb_status stream_create(int32_t device, int32_t priority, tb_stream* stream);
  tb_status stream_destroy(tb_stream stream);
  tb_status stream_query(tb_stream stream);
  tb_status stream_synchronize(tb_stream stream);
  tb_status stream_wait_event(tb_stream stream, tb_event event);

  // Events
  tb_status event_create(int32_t device, int32_t enable_timing, tb_event* event);
  tb_status event_destroy(tb_event event);
  tb_status event_record(tb_event event, tb_stream stream);
  tb_status event_query(tb_event event);
  tb_status event_synchronize(tb_event event);
  tb_status event_elapsed_time(tb_event start, tb_event end, float* milliseconds);

 private:
  explicit EmuRuntime(const EmuOptions& options) : options_(options), faults_(options.fault) {}

  tb_status check_device(const char* operation, int32_t device) const;
  // The device whose memory contains `pointer`, or nullptr.
  const EmuDevice* device_containing(const void* pointer) const;
  // Translates a device range to the shadow view, or fails with TB_ERROR_INVALID_POINTER.
  tb_status resolve_device_range(const char* operation, const char* role, const void* pointer, size_t bytes,
                                 std::byte** shadow) const;
  // A host range must be non-NULL and must not be device memory (that would be the wrong kind).
  tb_status check_host_range(const char* operation, const char* role, const void* pointer, size_t bytes) const;
  // Validates a copy of any kind and turns it into a Transfer (fault decided last).
  tb_status plan_copy(const char* operation, void* destination, const void* source, size_t bytes,
                      int kind, Transfer& transfer);
  tb_status find_stream(const char* operation, tb_stream handle, std::shared_ptr<Stream>& stream) const;
  tb_status find_event(const char* operation, tb_event handle, std::shared_ptr<Event>& event) const;
  tb_status enqueue(const char* operation, tb_stream handle, Stream& stream, const Transfer& transfer);

  const EmuOptions options_;
  std::vector<std::unique_ptr<EmuDevice>> devices_;
  HostAllocations host_allocations_;
  FaultInjector faults_;
  HandleRegistry<Stream> streams_;
  HandleRegistry<Event> events_;
};

}  // namespace torchbridge::emu

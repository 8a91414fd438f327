#pragma once
// c10::Stream <-> runtime stream handles. Per device: id 0 is the default stream, ids
// 1..kPoolSize a round-robin pool (getStreamFromGlobalPool), later ids streams made by
// getNewStream. The current stream is per thread and per device, like CUDA's.

#include <torchbridge/sdk/runtime.h>

#include <c10/core/Stream.h>

namespace torchbridge::sdk {

inline constexpr int kStreamPoolSize = 8;

void init_streams(int device_count);
tb_stream native_stream(const c10::Stream& stream);
c10::Stream default_stream(c10::DeviceIndex device);
c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream pool_stream(c10::DeviceIndex device);
c10::Stream new_stream(c10::DeviceIndex device, int priority);
// Makes `stream` current on its device for this thread; returns the previous one.
c10::Stream exchange_current_stream(const c10::Stream& stream);

}  // namespace torchbridge::sdk

#pragma once
// c10::Stream <-> runtime stream handles. Per device: id 0 is the default stream, then one
// round-robin pool of kStreamPoolSize streams per priority (ids 1..kStreamPoolSize for priority
// 0, the others' created when first asked for; priorities clamped as below). torch.Stream(),
// getStreamFromGlobalPool and getNewStream all take from these pools, as CUDA's do: a program
// that makes a stream per iteration reuses a few runtime streams instead of creating one (an emu
// worker thread) each time, none of which would ever be destroyed. The current stream is per
// thread and per device.

#include <torchbridge/sdk/runtime.h>

#include <c10/core/Stream.h>

namespace torchbridge::sdk {

inline constexpr int kStreamPoolSize = 8;
// Priorities are clamped into [kHighestStreamPriority, 0], as torch clamps CUDA's into its four
// levels: at most four pools per device, whatever numbers a program asks for.
inline constexpr int kHighestStreamPriority = -3;

void init_streams(int device_count);
tb_stream native_stream(const c10::Stream& stream);
c10::Stream default_stream(c10::DeviceIndex device);
c10::Stream current_stream(c10::DeviceIndex device);
// The next stream of `priority`'s pool; priorities follow CUDA (lower runs first, 0 the default).
c10::Stream pool_stream(c10::DeviceIndex device, int priority);
// Makes `stream` current on its device for this thread; returns the previous one.
c10::Stream exchange_current_stream(const c10::Stream& stream);

}  // namespace torchbridge::sdk

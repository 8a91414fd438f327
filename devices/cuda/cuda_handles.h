// What the SDK's opaque tb_stream / tb_event handles point to, and the set of live handles.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <unordered_set>

#include "torchbridge/sdk/runtime.h"

// The SDK header declares these tags at global scope; they are completed here.
struct tb_stream_s {
  cudaStream_t stream;
  int32_t device;  // the device that was current when the stream was created
};

struct tb_event_s {
  cudaEvent_t event;
  int32_t device;  // an event can only be recorded on a stream of this device
};

namespace torchbridge::cuda_device {

// Handles this runtime created and has not destroyed yet. The SDK promises
// TB_ERROR_INVALID_HANDLE for an unknown or destroyed handle, while CUDA itself gives undefined
// behaviour (often a crash) for a destroyed stream or event; checking membership before every use
// keeps a caller's double destroy or stale handle an error instead. A freed address reused by a
// new handle is indistinguishable from it, which is acceptable: it is then a valid handle.
template <typename Handle>
class HandleRegistry {
 public:
  void add(Handle handle) {
    std::lock_guard lock(mutex_);
    live_.insert(handle);
  }
  // False when the handle was not live.
  bool remove(Handle handle) {
    std::lock_guard lock(mutex_);
    return live_.erase(handle) != 0;
  }
  bool contains(Handle handle) const {
    std::lock_guard lock(mutex_);
    return live_.count(handle) != 0;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_set<Handle> live_;
};

// Never destroyed: other libraries' static destructors (PyTorch's stream pools, for one) may
// still destroy streams while the process exits, after our own statics would be gone.
HandleRegistry<tb_stream>& live_streams();
HandleRegistry<tb_event>& live_events();

// TB_SUCCESS for a live handle, else TB_ERROR_INVALID_HANDLE with a message naming the entry.
tb_status check_stream(const char* entry, tb_stream stream);
tb_status check_event(const char* entry, tb_event event);

}  // namespace torchbridge::cuda_device

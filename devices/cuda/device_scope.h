// Makes one device current for the duration of a call and restores the caller's device after.
#pragma once

#include <cstdint>

#include "torchbridge/sdk/runtime.h"

namespace torchbridge::cuda_device {

// The CUDA runtime tracks the current device per host thread, and the SDK's "current device" is
// the same thing (set_device/get_device map straight onto it). An entry that works on a given
// device (malloc, stream creation, ...) must therefore not leave that device current behind, or
// the caller's later calls would silently land on the wrong GPU.
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope();

  // Makes `device` current (a no-op when it already is). Reports failures like any entry.
  tb_status enter(int32_t device);

 private:
  int previous_ = -1;
  bool switched_ = false;
};

}  // namespace torchbridge::cuda_device

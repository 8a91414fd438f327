#pragma once
// Fixed descriptions of real devices, for tests of the logic that reads only a DeviceInfo
// (the precision policy, the optimization plan) on hardware this machine does not have.

#include <torchbridge/device_info.h>

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace torchbridge::test_support {

// An NVIDIA T4 (sm_75): fp16 tensor cores, no bf16, TF32 or fp8 ones.
inline DeviceInfo tesla_t4() {
  DeviceInfo info;
  info.backend = "cuda";
  info.name = "Tesla T4";
  info.architecture = "sm_75";
  info.supported_dtypes = {c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half};
  info.features.fp16 = true;
  return info;
}

}  // namespace torchbridge::test_support

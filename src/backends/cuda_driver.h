#pragma once
// The few CUDA driver API calls TorchBridge needs to describe NVIDIA GPUs, loaded from
// libcuda.so.1 at run time. Works with any torch build, so even a CPU-only torch can tell
// "no driver" from "driver error" from "torch lacks CUDA". Internal.

#include <optional>
#include <string>

namespace torchbridge::cuda_driver {

// Values of CUdevice_attribute in cuda.h (stable across CUDA releases; a test checks them
// against cuda.h whenever the CUDA toolkit is present at build time).
inline constexpr int kAttrMultiprocessorCount = 16;
inline constexpr int kAttrIntegrated = 18;
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;
inline constexpr int kAttrPageableMemoryAccess = 88;
inline constexpr int kCudaErrorNoDevice = 100;

struct DriverStatus {
  bool library_found = false;
  int init_result = -1;        // CUresult of cuInit(0); 0 is success
  std::string error;           // human-readable problem, empty when the driver initialised
  int device_count = 0;
};

// Loads libcuda.so.1 once and calls cuInit(0); later calls return the cached result.
const DriverStatus& status();

struct DeviceProperties {
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessor_count = 0;
  bool integrated = false;
  bool pageable_memory_access = false;
  unsigned long long total_memory_bytes = 0;
};
// Properties of driver ordinal `ordinal`; raises with the driver's message on failure.
DeviceProperties device_properties(int ordinal);
// "13.0" from cuDriverGetVersion; empty when unavailable.
std::string driver_version();
// Formats CUDA's integer version encoding (1000 * major + 10 * minor) as "major.minor".
std::string format_cuda_version(long encoded);

}  // namespace torchbridge::cuda_driver

// Device entries: enumeration, the current device, properties, whole-device synchronization.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "cuda_context.h"
#include "cuda_entries.h"
#include "cuda_status.h"
#include "device_scope.h"

namespace torchbridge::cuda_device {
namespace {

// cudaDriverGetVersion encodes e.g. 12.4 as 12040; 0 means no driver is installed.
void format_driver_version(int version, char (&out)[64]) {
  if (version <= 0) {
    out[0] = '\0';
    return;
  }
  std::snprintf(out, sizeof(out), "%d.%d", version / 1000, (version % 1000) / 10);
}

// Whether host code may dereference a pointer returned by cudaMalloc on this device.
//
// Only hardware-coherent systems with Address Translation Services (NVLink-C2C: Grace Hopper,
// Grace Blackwell) map GPU allocations into the CPU's page tables; CUDA reports them with
// pageableMemoryAccess and pageableMemoryAccessUsesHostPageTables both set. Neither an integrated
// GPU (Tegra: cudaMalloc memory is GPU-only) nor pageableMemoryAccess alone (HMM on a PCIe
// system, which lets the *GPU* reach malloc'd host memory, not the CPU reach cudaMalloc memory)
// makes device pointers safe for the host, and claiming so would crash the host on first touch.
bool host_can_dereference_device_pointers(const cudaDeviceProp& prop) {
  return prop.pageableMemoryAccess != 0 && prop.pageableMemoryAccessUsesHostPageTables != 0;
}

}  // namespace

tb_status device_count(void* /*context*/, int32_t* count) {
  if (count == nullptr) return report_null_argument("device_count", "count");
  int value = 0;
  if (tb_status status = check_cuda("cudaGetDeviceCount", cudaGetDeviceCount(&value));
      status != TB_SUCCESS) {
    return status;
  }
  *count = value;
  return TB_SUCCESS;
}

tb_status set_device(void* context, int32_t device) {
  if (tb_status status = check_device_index(context_of(context), "set_device", device);
      status != TB_SUCCESS) {
    return status;
  }
  return check_cuda("cudaSetDevice", cudaSetDevice(device));
}

tb_status get_device(void* /*context*/, int32_t* device) {
  if (device == nullptr) return report_null_argument("get_device", "device");
  int value = 0;
  if (tb_status status = check_cuda("cudaGetDevice", cudaGetDevice(&value)); status != TB_SUCCESS) {
    return status;
  }
  *device = value;
  return TB_SUCCESS;
}

tb_status device_properties(void* context, int32_t device, tb_device_properties* properties) {
  if (properties == nullptr) return report_null_argument("device_properties", "properties");
  if (tb_status status = check_device_index(context_of(context), "device_properties", device);
      status != TB_SUCCESS) {
    return status;
  }

  cudaDeviceProp prop{};
  if (tb_status status =
          check_cuda("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device));
      status != TB_SUCCESS) {
    return status;
  }
  int driver_version = 0;
  if (tb_status status = check_cuda("cudaDriverGetVersion", cudaDriverGetVersion(&driver_version));
      status != TB_SUCCESS) {
    return status;
  }
  // Free memory is only known to the device's context, so this creates the primary context of
  // `device` if it had none yet (as torch.cuda.mem_get_info does).
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  {
    DeviceScope scope;
    if (tb_status status = scope.enter(device); status != TB_SUCCESS) return status;
    if (tb_status status = check_cuda("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes));
        status != TB_SUCCESS) {
      return status;
    }
  }

  tb_device_properties out;
  std::memset(&out, 0, sizeof(out));
  std::snprintf(out.name, sizeof(out.name), "%s", prop.name);
  std::snprintf(out.vendor, sizeof(out.vendor), "%s", "NVIDIA");
  std::snprintf(out.architecture, sizeof(out.architecture), "sm_%d%d", prop.major, prop.minor);
  format_driver_version(driver_version, out.driver_version);
  out.total_memory_bytes = prop.totalGlobalMem;
  out.free_memory_bytes = free_bytes;
  out.multiprocessor_count = prop.multiProcessorCount;
  out.host_addressable = host_can_dereference_device_pointers(prop) ? 1 : 0;
  out.is_real_hardware = 1;
  *properties = out;
  return TB_SUCCESS;
}

tb_status device_synchronize(void* context, int32_t device) {
  if (tb_status status = check_device_index(context_of(context), "device_synchronize", device);
      status != TB_SUCCESS) {
    return status;
  }
  // cudaDeviceSynchronize waits for the *current* device, so make `device` current for the wait.
  DeviceScope scope;
  if (tb_status status = scope.enter(device); status != TB_SUCCESS) return status;
  return check_cuda("cudaDeviceSynchronize", cudaDeviceSynchronize());
}

}  // namespace torchbridge::cuda_device

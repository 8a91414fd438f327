#include "backends/cuda_driver.h"

#include "core/dynamic_library.h"

#include <c10/util/Exception.h>

namespace torchbridge::cuda_driver {
namespace {

using CUresult = int;
using CUdevice = int;

struct Api {
  DynamicLibrary library{"libcuda.so.1"};
  CUresult (*init)(unsigned) = library.function<CUresult (*)(unsigned)>("cuInit");
  CUresult (*get_count)(int*) = library.function<CUresult (*)(int*)>("cuDeviceGetCount");
  CUresult (*get_device)(CUdevice*, int) = library.function<CUresult (*)(CUdevice*, int)>("cuDeviceGet");
  CUresult (*get_name)(char*, int, CUdevice) =
      library.function<CUresult (*)(char*, int, CUdevice)>("cuDeviceGetName");
  CUresult (*get_attribute)(int*, int, CUdevice) =
      library.function<CUresult (*)(int*, int, CUdevice)>("cuDeviceGetAttribute");
  CUresult (*total_mem)(size_t*, CUdevice) =
      library.function<CUresult (*)(size_t*, CUdevice)>("cuDeviceTotalMem_v2");
  CUresult (*driver_version)(int*) = library.function<CUresult (*)(int*)>("cuDriverGetVersion");
  CUresult (*error_string)(CUresult, const char**) =
      library.function<CUresult (*)(CUresult, const char**)>("cuGetErrorString");
};

const Api& api() {
  static const Api instance;
  return instance;
}

std::string describe(CUresult result) {
  const char* text = nullptr;
  if (api().error_string != nullptr && api().error_string(result, &text) == 0 && text != nullptr) {
    return std::string(text) + " (CUresult " + std::to_string(result) + ")";
  }
  return "CUresult " + std::to_string(result);
}

void check(CUresult result, const char* call) {
  TORCH_CHECK(result == 0, "CUDA driver call ", call, " failed: ", describe(result));
}

}  // namespace

const DriverStatus& status() {
  static const DriverStatus cached = [] {
    DriverStatus s;
    const Api& a = api();
    s.library_found = a.library.loaded();
    if (!s.library_found) {
      s.error = "the NVIDIA driver library libcuda.so.1 is not installed (" + a.library.load_error() + ")";
      return s;
    }
    if (a.init == nullptr || a.get_count == nullptr) {
      s.error = "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
      return s;
    }
    s.init_result = a.init(0);
    if (s.init_result != 0) {
      s.error = describe(s.init_result);
      return s;
    }
    a.get_count(&s.device_count);
    return s;
  }();
  return cached;
}

DeviceProperties device_properties(int ordinal) {
  TORCH_CHECK(status().init_result == 0, "CUDA driver unavailable: ", status().error);
  const Api& a = api();
  CUdevice device = 0;
  check(a.get_device(&device, ordinal), "cuDeviceGet");
  DeviceProperties p;
  char name[256] = {};
  check(a.get_name(name, sizeof(name), device), "cuDeviceGetName");
  p.name = name;
  int value = 0;
  check(a.get_attribute(&p.compute_major, kAttrComputeCapabilityMajor, device), "cuDeviceGetAttribute");
  check(a.get_attribute(&p.compute_minor, kAttrComputeCapabilityMinor, device), "cuDeviceGetAttribute");
  check(a.get_attribute(&p.multiprocessor_count, kAttrMultiprocessorCount, device), "cuDeviceGetAttribute");
  check(a.get_attribute(&value, kAttrIntegrated, device), "cuDeviceGetAttribute");
  p.integrated = value != 0;
  check(a.get_attribute(&value, kAttrPageableMemoryAccess, device), "cuDeviceGetAttribute");
  p.pageable_memory_access = value != 0;
  size_t total = 0;
  check(a.total_mem(&total, device), "cuDeviceTotalMem_v2");
  p.total_memory_bytes = total;
  return p;
}

std::string driver_version() {
  int version = 0;
  if (api().driver_version == nullptr || api().driver_version(&version) != 0) return "";
  return format_cuda_version(version);
}

std::string format_cuda_version(long encoded) {
  if (encoded <= 0) return "";
  return std::to_string(encoded / 1000) + "." + std::to_string((encoded % 1000) / 10);
}

}  // namespace torchbridge::cuda_driver

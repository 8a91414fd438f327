// AMD GPUs through torch's ROCm build. A ROCm torch reports the CUDA device type, so the build
// (CUDA hooks' hasROCM) tells the two apart. Names and versions come from the HIP runtime,
// opened at run time; only HIP calls whose signatures carry no versioned enums or structs are used.
#include "backends/adapters.h"
#include "core/dynamic_library.h"
#include "backends/accelerator_backend.h"
#include "backends/instinct_name.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::adapters {
namespace {

struct HipApi {
  DynamicLibrary library{"libamdhip64.so"};
  int (*device_name)(char*, int, int) = library.function<int (*)(char*, int, int)>("hipDeviceGetName");
  int (*driver_version)(int*) = library.function<int (*)(int*)>("hipDriverGetVersion");
  int (*runtime_version)(int*) = library.function<int (*)(int*)>("hipRuntimeGetVersion");
};

const HipApi& hip() {
  static const HipApi api;
  return api;
}

// HIP encodes versions as major * 10'000'000 + minor * 100'000 + patch.
std::string format_hip_version(int (*query)(int*)) {
  int v = 0;
  if (query == nullptr || query(&v) != 0 || v <= 0) return "";
  return std::to_string(v / 10000000) + "." + std::to_string((v / 100000) % 100) + "." +
         std::to_string(v % 100000);
}

class RocmBackend final : public AcceleratorBackend {
 public:
  RocmBackend() : AcceleratorBackend(c10::DeviceType::CUDA) {}

  std::string name() const override { return "rocm"; }

  Availability availability() const override {
    const auto& hooks = at::detail::getCUDAHooks();
    if (!hooks.isBuilt() || !hooks.hasROCM()) {
      return {AvailabilityStatus::kNotCompiled,
              "not compiled into this torch build (torch " TORCH_VERSION " is not a ROCm build)"};
    }
    if (hooks.getNumGPUs() > 0) return {AvailabilityStatus::kAvailable, ""};
    if (!hip().library.loaded()) {
      return {AvailabilityStatus::kDriverError,
              "driver error: the HIP runtime could not be loaded (" + hip().library.load_error() + ")"};
    }
    return {AvailabilityStatus::kNoDevice, "compiled in, no device found"};
  }

  int device_count() const override {
    return is_available() ? static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()) : 0;
  }

  DeviceInfo info(int index) const override {
    check_device_index(index);
    DeviceInfo info;
    info.backend = name();
    info.index = index;
    info.vendor = "AMD";
    char device_name[256] = {};
    if (hip().device_name != nullptr && hip().device_name(device_name, sizeof(device_name), index) == 0) {
      info.name = device_name;
    }
    if (const auto memory = memory_info(index)) {
      info.free_memory_bytes = memory->first;
      info.total_memory_bytes = memory->second;
    }
    info.driver_version = format_hip_version(hip().driver_version);
    info.runtime_version = format_hip_version(hip().runtime_version);
    // Architecture and CU count need HIP's versioned device-property layout; they stay empty
    // rather than being guessed. Precision support follows the Instinct generation in the name.
    const int generation = instinct_generation(info.name);
    info.features.fp16 = true;
    info.features.bf16 = generation >= 100;
    info.features.fp8 = generation >= 300;
    info.features.flash_attention = generation >= 200;

    using c10::ScalarType;
    info.supported_dtypes = {ScalarType::Bool,  ScalarType::Byte, ScalarType::Char,
                             ScalarType::Short, ScalarType::Int,  ScalarType::Long,
                             ScalarType::Float, ScalarType::Double, ScalarType::Half};
    if (info.features.bf16) info.supported_dtypes.push_back(ScalarType::BFloat16);
    if (info.features.fp8) {
      // MI300 implements the "fnuz" fp8 variants; MI350 and newer the OCP ones.
      const bool ocp = generation >= 350;
      info.supported_dtypes.push_back(ocp ? ScalarType::Float8_e4m3fn : ScalarType::Float8_e4m3fnuz);
      info.supported_dtypes.push_back(ocp ? ScalarType::Float8_e5m2 : ScalarType::Float8_e5m2fnuz);
    }
    return info;
  }
};

}  // namespace

std::shared_ptr<Backend> make_rocm_backend() { return std::make_shared<RocmBackend>(); }

}  // namespace torchbridge::adapters

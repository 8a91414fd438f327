// NVIDIA GPUs through torch's CUDA build. Availability and streams come from torch; the
// description comes from the CUDA driver, so it is what the hardware reports.
#include "backends/adapters.h"
#include "backends/cuda_driver.h"
#include "backends/accelerator_backend.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::adapters {
namespace {

class CudaBackend final : public AcceleratorBackend {
 public:
  CudaBackend() : AcceleratorBackend(c10::DeviceType::CUDA) {}

  std::string name() const override { return "cuda"; }

  Availability availability() const override {
    const auto& hooks = at::detail::getCUDAHooks();
    if (!hooks.isBuilt()) {
      return {AvailabilityStatus::kNotCompiled,
              "not compiled into this torch build (torch " TORCH_VERSION " has no CUDA support)"};
    }
    if (hooks.hasROCM()) {
      return {AvailabilityStatus::kNotCompiled,
              "not compiled into this torch build (torch " TORCH_VERSION
              " is a ROCm build; use the 'rocm' backend)"};
    }
    if (hooks.getNumGPUs() > 0) return {AvailabilityStatus::kAvailable, ""};
    const auto& driver = cuda_driver::status();
    if (!driver.library_found) {
      return {AvailabilityStatus::kNoDevice, "compiled in, no device found: " + driver.error};
    }
    if (driver.init_result != 0 && driver.init_result != cuda_driver::kCudaErrorNoDevice) {
      return {AvailabilityStatus::kDriverError, "driver error: " + driver.error};
    }
    return {AvailabilityStatus::kNoDevice, "compiled in, no device found"};
  }

  int device_count() const override {
    return is_available() ? static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()) : 0;
  }

  DeviceInfo info(int index) const override {
    check_device_index(index);
    // Torch and the driver number devices the same way (both honour CUDA_VISIBLE_DEVICES).
    const auto props = cuda_driver::device_properties(index);
    const int sm = props.compute_major * 10 + props.compute_minor;

    DeviceInfo info;
    info.backend = name();
    info.index = index;
    info.name = props.name;
    info.vendor = "NVIDIA";
    info.architecture = "sm_" + std::to_string(sm);
    info.multiprocessor_count = props.multiprocessor_count;
    info.total_memory_bytes = props.total_memory_bytes;
    if (const auto memory = memory_info(index)) info.free_memory_bytes = memory->first;
    info.driver_version = cuda_driver::driver_version();
    info.runtime_version = cuda_driver::format_cuda_version(at::detail::getCUDAHooks().versionCUDART());

    info.features.fp16 = sm >= 53;
    info.features.bf16 = sm >= 80;
    info.features.tf32 = sm >= 80;
    info.features.flash_attention = sm >= 80;  // torch's flash-attention kernels need Ampere+
    info.features.fp8 = sm >= 89;              // Ada and Hopper introduced fp8 tensor cores
    info.features.unified_memory = props.integrated || props.pageable_memory_access;

    using c10::ScalarType;
    info.supported_dtypes = {ScalarType::Bool, ScalarType::Byte,  ScalarType::Char,
                             ScalarType::Short, ScalarType::Int,  ScalarType::Long,
                             ScalarType::Float, ScalarType::Double, ScalarType::ComplexFloat,
                             ScalarType::ComplexDouble};
    if (info.features.fp16) info.supported_dtypes.push_back(ScalarType::Half);
    if (info.features.bf16) info.supported_dtypes.push_back(ScalarType::BFloat16);
    if (info.features.fp8) {
      info.supported_dtypes.push_back(ScalarType::Float8_e4m3fn);
      info.supported_dtypes.push_back(ScalarType::Float8_e5m2);
    }
    return info;
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend() { return std::make_shared<CudaBackend>(); }

}  // namespace torchbridge::adapters

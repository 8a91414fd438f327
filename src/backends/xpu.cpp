// Intel GPUs through torch's XPU build. Count, streams, events and memory statistics come from
// torch's device-generic machinery; the device name needs SYCL, which only the Python package
// reaches (torch.xpu.get_device_properties), so the C++ description leaves it empty.
#include "backends/adapters.h"
#include "backends/accelerator_backend.h"

#include <ATen/detail/XPUHooksInterface.h>
#include <torch/version.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::adapters {
namespace {

class XpuBackend final : public AcceleratorBackend {
 public:
  XpuBackend() : AcceleratorBackend(c10::DeviceType::XPU) {}

  std::string name() const override { return "xpu"; }

  Availability availability() const override {
    const auto& hooks = at::detail::getXPUHooks();
    if (!hooks.isBuilt()) {
      return {AvailabilityStatus::kNotCompiled,
              "not compiled into this torch build (torch " TORCH_VERSION " has no XPU support)"};
    }
    if (hooks.getNumGPUs() > 0) return {AvailabilityStatus::kAvailable, ""};
    return {AvailabilityStatus::kNoDevice, "compiled in, no device found"};
  }

  int device_count() const override {
    return is_available() ? static_cast<int>(at::detail::getXPUHooks().getNumGPUs()) : 0;
  }

  DeviceInfo info(int index) const override {
    check_device_index(index);
    DeviceInfo info;
    info.backend = name();
    info.index = index;
    info.vendor = "Intel";
    if (const auto memory = memory_info(index)) {
      info.free_memory_bytes = memory->first;
      info.total_memory_bytes = memory->second;
    }
    // Every Intel GPU torch supports (Arc, Flex, Max, Lunar Lake) computes fp16 and bf16.
    info.features.fp16 = true;
    info.features.bf16 = true;
    using c10::ScalarType;
    info.supported_dtypes = {ScalarType::Bool, ScalarType::Byte,  ScalarType::Char,
                             ScalarType::Short, ScalarType::Int,  ScalarType::Long,
                             ScalarType::Float, ScalarType::Half, ScalarType::BFloat16};
    return info;
  }
};

}  // namespace

std::shared_ptr<Backend> make_xpu_backend() { return std::make_shared<XpuBackend>(); }

}  // namespace torchbridge::adapters

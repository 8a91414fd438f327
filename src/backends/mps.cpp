// Apple GPUs through torch's MPS build (macOS). One device; memory figures come from the MPS
// allocator through torch's MPS hooks, since it is not a c10::DeviceAllocator.
#include "backends/adapters.h"
#include "backends/accelerator_backend.h"

#include <ATen/detail/MPSHooksInterface.h>
#include <torch/version.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::adapters {
namespace {

class MpsBackend final : public AcceleratorBackend {
 public:
  MpsBackend() : AcceleratorBackend(c10::DeviceType::MPS) {}

  std::string name() const override { return "mps"; }

  Availability availability() const override {
    const auto& hooks = at::detail::getMPSHooks();
    if (!hooks.isBuilt()) {
      return {AvailabilityStatus::kNotCompiled,
              "not compiled into this torch build (torch " TORCH_VERSION " has no MPS support)"};
    }
    if (hooks.hasMPS()) return {AvailabilityStatus::kAvailable, ""};
    return {AvailabilityStatus::kNoDevice, "compiled in, no device found (MPS needs macOS 12.3+ on a Metal GPU)"};
  }

  int device_count() const override { return is_available() ? 1 : 0; }

  DeviceInfo info(int index) const override {
    check_device_index(index);
    const auto& hooks = at::detail::getMPSHooks();
    DeviceInfo info;
    info.backend = name();
    info.index = index;
    info.vendor = "Apple";
    info.total_memory_bytes = hooks.getRecommendedMaxMemory();
    info.features.fp16 = true;
    info.features.bf16 = hooks.isOnMacOSorNewer(14, 0);  // MPS gained bf16 in macOS 14
    info.features.unified_memory = true;                  // Apple silicon shares host memory
    using c10::ScalarType;
    info.supported_dtypes = {ScalarType::Bool,  ScalarType::Byte, ScalarType::Char,
                             ScalarType::Short, ScalarType::Int,  ScalarType::Long,
                             ScalarType::Float, ScalarType::Half};
    if (info.features.bf16) info.supported_dtypes.push_back(ScalarType::BFloat16);
    return info;
  }

  MemoryStats memory_stats(int index) const override {
    check_device_index(index);
    const auto& hooks = at::detail::getMPSHooks();
    MemoryStats stats;
    stats.allocated_bytes = static_cast<int64_t>(hooks.getCurrentAllocatedMemory());
    stats.reserved_bytes = static_cast<int64_t>(hooks.getDriverAllocatedMemory());
    stats.total_bytes = static_cast<int64_t>(hooks.getRecommendedMaxMemory());
    stats.source = "torch MPS allocator (MPS hooks)";
    return stats;
  }

  void reset_peak_memory_stats(int index) override {
    check_device_index(index);
    TORCH_CHECK(false, "the mps backend keeps no peak memory statistics to reset "
                       "(torch's MPS allocator does not track peaks)");
  }

  void empty_cache() override {
    check_available();
    at::detail::getMPSHooks().emptyCache();
  }

  void synchronize(int index) override {
    check_device_index(index);
    at::detail::getMPSHooks().deviceSynchronize();
  }
};

}  // namespace

std::shared_ptr<Backend> make_mps_backend() { return std::make_shared<MpsBackend>(); }

}  // namespace torchbridge::adapters

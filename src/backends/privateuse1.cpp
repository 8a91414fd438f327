// Whatever device occupies PyTorch's PrivateUse1 slot in this process (a TorchBridge SDK device
// or any other vendor's plugin), described only through c10's device-generic interfaces.
#include "backends/adapters.h"
#include "backends/accelerator_backend.h"

#include <torchbridge/privateuse1.h>

#include <c10/core/DeviceType.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

std::mutex declaration_mutex;
std::optional<PrivateUse1Declaration> declared;

std::optional<PrivateUse1Declaration> current_declaration() {
  std::lock_guard<std::mutex> lock(declaration_mutex);
  return declared;
}

}  // namespace

void declare_privateuse1_device(const PrivateUse1Declaration& declaration) {
  std::lock_guard<std::mutex> lock(declaration_mutex);
  declared = declaration;
}

namespace adapters {
namespace {

class PrivateUse1Backend final : public AcceleratorBackend {
 public:
  PrivateUse1Backend() : AcceleratorBackend(c10::DeviceType::PrivateUse1) {}

  // The name the plugin registered (e.g. "emu"); torch's default name before any registration.
  std::string name() const override { return c10::get_privateuse1_backend(); }

  bool is_real_hardware() const override {
    const auto declaration = current_declaration();
    return declaration.has_value() && declaration->is_real_hardware;
  }

  Availability availability() const override {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
      return {AvailabilityStatus::kNotRegistered,
              "no device is registered through PrivateUse1 in this process (load a device plugin "
              "first, e.g. a TorchBridge SDK device)"};
    }
    if (guard_device_count() == 0) {
      return {AvailabilityStatus::kNoDevice, "'" + name() + "' is registered, but reports no device"};
    }
    return {AvailabilityStatus::kAvailable, ""};
  }

  int device_count() const override { return is_available() ? guard_device_count() : 0; }

  DeviceInfo info(int index) const override {
    const c10::Device dev = device(index);
    DeviceInfo info;
    info.backend = name();
    info.index = index;
    info.name = name() + ":" + std::to_string(index);
    if (const auto declaration = current_declaration()) info.vendor = declaration->vendor;
    if (const auto memory = memory_info(index)) {
      info.free_memory_bytes = memory->first;
      info.total_memory_bytes = memory->second;
    }
    // The device's own capability report (c10::DeviceCapability) says which dtypes it supports.
    try {
      const c10::DeviceCapability capability = guard().getDeviceCapability(dev);
      capability.forEachSupportedScalarType(
          [&](c10::ScalarType dtype) { info.supported_dtypes.push_back(dtype); });
    } catch (const c10::Error&) {
      // The plugin does not report capabilities: the dtype list stays empty (unknown).
    }
    const auto supports = [&](c10::ScalarType dtype) {
      return std::find(info.supported_dtypes.begin(), info.supported_dtypes.end(), dtype) !=
             info.supported_dtypes.end();
    };
    info.features.fp16 = supports(c10::ScalarType::Half);
    info.features.bf16 = supports(c10::ScalarType::BFloat16);
    info.features.fp8 = supports(c10::ScalarType::Float8_e4m3fn);
    if (const auto declaration = current_declaration(); declaration && declaration->describe) {
      declaration->describe(index, info);
    }
    return info;
  }
};

}  // namespace

std::shared_ptr<Backend> make_privateuse1_backend() { return std::make_shared<PrivateUse1Backend>(); }

}  // namespace adapters
}  // namespace torchbridge

#include <torchbridge/one_accelerator.h>

#include <torchbridge/backend.h>

#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <string>

namespace torchbridge {
namespace {

constexpr const char* kWhy = kOneAcceleratorReason;

// Native accelerator types torch may have been built with, and how a user names them.
struct NativeType {
  c10::DeviceType type;
  const char* name;
  const char* context;  // what "in use" means on it
};
constexpr NativeType kNativeTypes[] = {
    {c10::DeviceType::CUDA, "cuda", "CUDA context"},
    {c10::DeviceType::XPU, "xpu", "XPU context"},
    {c10::DeviceType::MPS, "mps", "MPS context"},
    {c10::DeviceType::MTIA, "mtia", "MTIA context"},
};

bool built_with(c10::DeviceType type) {
  try {
    return at::globalContext().getAcceleratorHooksInterface(type).isBuilt();
  } catch (const c10::Error&) {
    return false;  // no hooks of this type in this torch build
  }
}

}  // namespace

std::optional<std::string> native_accelerator_in_use() {
  for (const auto& native : kNativeTypes) {
    if (!built_with(native.type)) continue;
    const auto& hooks = at::globalContext().getAcceleratorHooksInterface(native.type);
    // isAvailable() and deviceCount() never create a context; hasPrimaryContext() only reads.
    if (!hooks.isAvailable()) continue;
    const auto count = hooks.deviceCount();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      if (hooks.hasPrimaryContext(i)) {
        return std::string(native.name) + " (device " + std::to_string(i) + " has a " + native.context + ")";
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> registered_privateuse1_device() {
  if (!at::isPrivateUse1HooksRegistered()) return std::nullopt;
  return c10::get_privateuse1_backend();
}

bool is_native_accelerator(const Backend& backend) {
  const c10::DeviceType type = backend.device_type();
  return type != c10::DeviceType::CPU && type != c10::DeviceType::PrivateUse1;
}

void check_sdk_device_may_register(const std::string& name) {
  const auto in_use = native_accelerator_in_use();
  TORCH_CHECK(!in_use.has_value(), "cannot load SDK device '", name, "': this process already uses ", in_use.value_or(""),
              ". ", kWhy, ". Run '", name,
              "' in a separate process (torch.multiprocessing with the 'spawn' start method, or a "
              "second program); `torchbridge validate` and `torchbridge portability` do this by "
              "themselves.");
}

void check_native_accelerator_may_be_used(const Backend& backend) {
  if (!is_native_accelerator(backend)) return;
  const auto sdk_device = registered_privateuse1_device();
  TORCH_CHECK(!sdk_device.has_value(), "backend '", backend.name(), "' cannot be used in this process: SDK device '",
              sdk_device.value_or(""), "' is registered as PyTorch's PrivateUse1 device. ", kWhy,
              ". Use '", backend.name(), "' and '", sdk_device.value_or(""),
              "' in separate processes; `torchbridge validate` and `torchbridge portability` do "
              "this by themselves.");
}

}  // namespace torchbridge

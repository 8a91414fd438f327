// AutocastScope: the enter/exit sequence of Python's torch.autocast over ATen's thread-local
// autocast state, so C++ and Python scopes nest with each other (they share the same counter and
// cache).
#include <torchbridge/amp/autocast_scope.h>

#include "core/devices_in_process.h"

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>

namespace torchbridge::amp {
namespace {

std::string device_type_name(c10::DeviceType device_type) { return c10::DeviceTypeName(device_type, true); }

c10::DeviceType parse_device_type(const std::string& name) {
  // c10::Device knows the registered PrivateUse1 name ("emu") as well as the built-in types.
  try {
    return c10::Device(name).type();
  } catch (const c10::Error&) {
    TORCH_CHECK_VALUE(false, "AutocastScope: unknown device type '", name,
                      "' (expected a torch device type such as 'cpu', 'cuda' or a loaded SDK device's name)");
  }
}

}  // namespace

AutocastScope::AutocastScope(c10::DeviceType device_type, AutocastOptions options) : device_type_(device_type) {
  TORCH_CHECK_VALUE(at::autocast::is_autocast_available(device_type_), "AutocastScope: autocast is not available for "
                    "device type '", device_type_name(device_type_), "' (torch has no autocast dispatch key for it)");
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  dtype_ = options.dtype.value_or(previous_dtype_);
  // Checked before any state changes, so a refused scope leaves nothing behind (the destructor of
  // a throwing constructor never runs).
  TORCH_CHECK_VALUE(c10::isFloatingType(dtype_), "AutocastScope: dtype ", c10::toString(dtype_),
                    " is not a floating-point type (expected e.g. Half or BFloat16)");

  // Off CUDA, torch.autocast autocasts to float16 and bfloat16 only (an SDK device's module
  // lists the same two): another dtype warns and leaves autocast off, as torch does. Enabled with
  // float64 or float32, the scope computed matmuls in that dtype instead of leaving them alone.
  bool enabled = options.enabled;
  // As torch.autocast: a device type this process has no device of warns and leaves autocast off
  // ("cuda" on a CPU-only torch turned CUDA autocast on, silently).
  if (enabled && device_type_ != c10::DeviceType::CPU && detail::devices_in_process(device_type_).value_or(0) == 0) {
    TORCH_WARN("AutocastScope: device type '", device_type_name(device_type_), "' has no device in this process; ",
               "autocast is disabled in this scope, as torch.autocast disables it");
    enabled = false;
  }
  const bool two_dtypes_only = device_type_ == c10::DeviceType::CPU || device_type_ == c10::DeviceType::XPU ||
                               device_type_ == c10::DeviceType::MPS || device_type_ == c10::DeviceType::PrivateUse1;
  if (enabled && two_dtypes_only && dtype_ != at::kHalf && dtype_ != at::kBFloat16) {
    TORCH_WARN("AutocastScope: autocast on ", device_type_name(device_type_), " supports Half and BFloat16, not ",
               c10::toString(dtype_), "; autocast is disabled in this scope, as torch.autocast disables it");
    enabled = false;
  }
  at::autocast::set_autocast_enabled(device_type_, enabled);
  at::autocast::set_autocast_dtype(device_type_, dtype_);
  at::autocast::set_autocast_cache_enabled(options.cache_enabled.value_or(previous_cache_enabled_));
  at::autocast::increment_nesting();
}

AutocastScope::AutocastScope(const std::string& device_type, AutocastOptions options)
    : AutocastScope(parse_device_type(device_type), options) {}

AutocastScope::~AutocastScope() {
  // Same order as torch.autocast.__exit__: the cache goes when the outermost region closes, then
  // the previous settings return.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

}  // namespace torchbridge::amp

#pragma once
// An RAII autocast region for C++ programs: what `with torch.autocast(device_type, dtype):` is in
// Python. LibTorch exposes autocast only as thread-local setters (ATen/autocast_mode.h), which a
// C++ program has to pair by hand and which leak on an exception; this scope pairs them.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace torchbridge::amp {

struct AutocastOptions {
  // The lower precision eligible operators run in; unset keeps the device's current autocast
  // dtype (torch's defaults: bfloat16 on the CPU, float16 on CUDA and SDK devices).
  std::optional<c10::ScalarType> dtype;
  // false makes a scope that turns autocast off inside an enclosing one.
  bool enabled = true;
  // Whether casts of leaf weights are cached while the outermost scope is open; unset keeps the
  // current setting (true unless changed).
  std::optional<bool> cache_enabled;
};

// Enables autocast for `device_type` on the calling thread until destruction, then restores the
// enabled flag, dtype and cache setting that were in effect before — also when the scope is left
// by an exception. Scopes nest; when the outermost scope closes (the nesting counter torch shares
// with Python's torch.autocast returns to zero) the cast cache is cleared, so weight casts are not
// held beyond the region and updated weights are cast afresh next time.
//
// Works for every device type torch has an autocast dispatch key for, including SDK devices
// (PrivateUse1, e.g. emu). Raises c10::ValueError naming the device type or dtype when autocast is
// not available for that device type or the dtype is not a floating-point type.
class AutocastScope {
 public:
  explicit AutocastScope(c10::DeviceType device_type, AutocastOptions options = {});
  // `device_type` as torch spells it: "cpu", "cuda", "emu" (a loaded SDK device's name), ...
  explicit AutocastScope(const std::string& device_type, AutocastOptions options = {});
  ~AutocastScope();

  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  AutocastScope(AutocastScope&&) = delete;
  AutocastScope& operator=(AutocastScope&&) = delete;

  c10::DeviceType device_type() const { return device_type_; }
  c10::ScalarType dtype() const { return dtype_; }

 private:
  c10::DeviceType device_type_;
  c10::ScalarType dtype_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

}  // namespace torchbridge::amp

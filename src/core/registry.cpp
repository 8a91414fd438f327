#include <torchbridge/registry.h>

#include <torchbridge/one_accelerator.h>

#include "core/to_lower.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

namespace torchbridge {
namespace {

using detail::to_lower;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::vector<BackendEntry> BackendRegistry::entries() const {
  std::vector<BackendEntry> out = builtin_;
  for (auto& entry : out) {
    if (entry.priority != kPrivateUse1Priority) continue;
    // Once a plugin renamed PrivateUse1, its name is the canonical one.
    const std::string registered = entry.backend->name();
    if (registered != entry.name) {
      entry.aliases.push_back(entry.name);
      entry.name = registered;
    }
  }
  return out;
}

std::vector<std::string> BackendRegistry::valid_names() const {
  std::vector<std::string> names;
  for (const auto& entry : entries()) {
    names.push_back(entry.name);
    names.insert(names.end(), entry.aliases.begin(), entry.aliases.end());
  }
  if (loadable_) {
    for (const auto& name : loadable_()) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::shared_ptr<Backend> BackendRegistry::lookup(const std::string& name) const {
  const std::string wanted = to_lower(name);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (const auto& entry : entries()) {
      if (entry.name == wanted ||
          std::find(entry.aliases.begin(), entry.aliases.end(), wanted) != entry.aliases.end()) {
        return entry.backend;
      }
    }
    // An unknown name may be an SDK device that can be loaded on demand.
    if (attempt == 0 && !(resolver_ && !wanted.empty() && resolver_(wanted))) break;
  }
  const bool looks_like_device = name.find(':') != std::string::npos;
  TORCH_CHECK_VALUE(false, "unknown backend '", name, "'; valid names: ", join(valid_names()),
                    looks_like_device ? " (a backend name carries no device index: pass the "
                                        "backend name and select the device by index)"
                                      : "");
}

c10::DeviceType BackendRegistry::device_type_of(const std::string& name) const {
  const std::string wanted = to_lower(name);
  for (const auto& entry : entries()) {
    if (entry.name == wanted ||
        std::find(entry.aliases.begin(), entry.aliases.end(), wanted) != entry.aliases.end()) {
      return entry.backend->device_type();
    }
  }
  if (loadable_) {
    const auto names = loadable_();
    if (std::find(names.begin(), names.end(), wanted) != names.end()) return c10::DeviceType::PrivateUse1;
  }
  return lookup(name)->device_type();  // raises for unknown names, listing the valid ones
}

std::shared_ptr<Backend> BackendRegistry::create(const std::string& name) const {
  auto backend = lookup(name);
  const Availability availability = backend->availability();
  TORCH_CHECK(availability.available(), "backend '", backend->name(), "' is not available: ",
              availability.reason);
  check_native_accelerator_may_be_used(*backend);
  return backend;
}

std::string BackendRegistry::detect_best_backend() const {
  // "auto" (any case) asks for detection, as the configuration's backend field documents it.
  const char* forced = std::getenv(kBackendEnvVar);
  if (forced != nullptr && to_lower(forced) == "auto") forced = nullptr;
  if (forced != nullptr && *forced != '\0') {
    std::shared_ptr<Backend> backend;
    try {
      backend = lookup(forced);
    } catch (const c10::Error& error) {
      // lookup() both refuses unknown names and loads SDK devices, whose start may fail: its own
      // message says which ("device 'cudasdk' failed to start: ...", not "is not a backend name").
      TORCH_CHECK_VALUE(false, kBackendEnvVar, "='", forced, "': ", error.msg());
    }
    const Availability availability = backend->availability();
    TORCH_CHECK(availability.available(), kBackendEnvVar, "='", forced, "' names backend '",
                backend->name(), "', which is not available: ", availability.reason);
    return backend->name();
  }
  for (const auto& entry : entries()) {
    const bool preferable = entry.name == "cpu" || entry.backend->is_real_hardware();
    if (preferable && entry.backend->is_available()) return entry.name;
  }
  TORCH_CHECK(false, "no backend is available, not even the CPU");
}

std::pair<BackendRegistry::NameResolver, BackendRegistry::LoadableNames> BackendRegistry::set_name_resolver(
    NameResolver resolver, LoadableNames loadable) {
  return {std::exchange(resolver_, std::move(resolver)), std::exchange(loadable_, std::move(loadable))};
}

}  // namespace torchbridge

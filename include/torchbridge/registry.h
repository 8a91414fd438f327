#pragma once
// Finding backends by name, and choosing the best one on this machine.

#include <torchbridge/backend.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {

// Environment variable that overrides detect_best_backend() with a backend name or alias.
inline constexpr const char* kBackendEnvVar = "TORCHBRIDGE_BACKEND";

struct BackendEntry {
  std::string name;                  // canonical name
  std::vector<std::string> aliases;  // other accepted spellings (lower case)
  int priority = 0;                  // higher wins in detect_best_backend()
  std::shared_ptr<Backend> backend;
};

class BackendRegistry {
 public:
  // The process-wide registry, holding every built-in adapter. The class lives in the core layer;
  // this one instance is assembled by the backends layer (src/backends/builtin_backends.cpp),
  // which knows the adapters, so core code never names an adapter.
  static BackendRegistry& instance();
  // Detection priority of the PrivateUse1 entry (between the native accelerators and the CPU).
  static constexpr int kPrivateUse1Priority = 10;

  // Every backend known to this build, in detection-priority order (best first),
  // whether or not it is available. The PrivateUse1 entry carries the registered device name.
  std::vector<BackendEntry> entries() const;
  // Canonical names and aliases accepted by create()/lookup(), sorted, for error messages.
  std::vector<std::string> valid_names() const;

  // The backend for a name or alias, available or not. Unknown names raise, listing valid names.
  std::shared_ptr<Backend> lookup(const std::string& name) const;
  // Like lookup(), but also raises with the backend's reason when it is unavailable, and when it
  // is a native accelerator in a process that holds an SDK device (one_accelerator.h).
  std::shared_ptr<Backend> create(const std::string& name) const;

  // The torch device type a name or alias stands for, without loading or initialising anything:
  // a built-in adapter's type, or PrivateUse1 for the registered SDK device and for every device
  // library the SDK could load. Unknown names raise like lookup().
  c10::DeviceType device_type_of(const std::string& name) const;

  // Name of the best available backend: TORCHBRIDGE_BACKEND when set (validated, and it must be
  // available), otherwise the first available backend in priority order
  // cuda > rocm > xpu > mps > tpu > PrivateUse1 real hardware > cpu.
  std::string detect_best_backend() const;

  // Hook for the device SDK: called with a name that is not otherwise known, before lookup()
  // gives up. Returns true when it made the name resolvable (e.g. loaded an SDK device).
  using NameResolver = std::function<bool(const std::string& name)>;
  // `loadable` lists the names the resolver could load, for error messages. Returns the pair it
  // replaced, so that whoever overrides the SDK's resolver for a while can put it back.
  using LoadableNames = std::function<std::vector<std::string>()>;
  std::pair<NameResolver, LoadableNames> set_name_resolver(NameResolver resolver, LoadableNames loadable = nullptr);

 private:
  BackendRegistry();
  std::vector<BackendEntry> builtin_;
  NameResolver resolver_;
  LoadableNames loadable_;
};

// Shorthands over BackendRegistry::instance(), matching the Python API's names (defined with the
// instance, in the backends layer).
std::shared_ptr<Backend> create_backend(const std::string& name);
std::string detect_best_backend();
using BackendFactory = BackendRegistry;

}  // namespace torchbridge

// The process's backend registry, assembled from the built-in adapters. This is where the
// registry class (core) meets the adapters (this layer): core code only sees the Backend
// interface, and adding an adapter touches this file and its own.
#include <torchbridge/registry.h>

#include "backends/adapters.h"

#include <memory>
#include <string>
#include <vector>

namespace torchbridge {

BackendRegistry& BackendRegistry::instance() {
  static BackendRegistry registry;
  return registry;
}

BackendRegistry::BackendRegistry() {
  // Detection priority, best first: cuda > rocm > xpu > mps > tpu > PrivateUse1 hardware > cpu.
  builtin_ = {
      {"cuda", {"nvidia"}, 60, adapters::make_cuda_backend()},
      {"rocm", {"hip", "amd"}, 50, adapters::make_rocm_backend()},
      {"xpu", {"intel"}, 40, adapters::make_xpu_backend()},
      {"mps", {"apple"}, 30, adapters::make_mps_backend()},
      {"tpu", {"xla"}, 20, adapters::make_tpu_backend()},
      {"privateuseone", {"privateuse1"}, kPrivateUse1Priority, adapters::make_privateuse1_backend()},
      {"cpu", {}, 0, adapters::make_cpu_backend()},
  };
}

std::shared_ptr<Backend> create_backend(const std::string& name) { return BackendRegistry::instance().create(name); }

std::string detect_best_backend() { return BackendRegistry::instance().detect_best_backend(); }

}  // namespace torchbridge

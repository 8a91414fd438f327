#pragma once
// UnifiedManager: one object that turns a TorchBridgeConfig into a backend, a device, a precision
// decision, and models prepared for them. `optimize` carries out the optimization plan
// (plan.h) on a LibTorch module and reports every step: applied, skipped and why, or left to the
// caller (C++ modules have no forward pass a library can wrap, so autocast is entered by the
// caller with the scope the manager hands out: `auto scope = manager.autocast();`).

#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/backend.h>
#include <torchbridge/optimize/compiled_model.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/optimize/plan.h>
#include <torchbridge/precision_policy.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace torch::jit {
struct Module;
}

namespace torchbridge {

struct StepOutcome {
  std::string name;
  OptLevel level;
  std::string outcome;  // "applied", "skipped", or "caller" (the program must act: see detail)
  std::string detail;
};

struct OptimizationReport {
  std::string backend;
  std::string device;  // "cuda:0"
  OptLevel level = OptLevel::O0;
  bool training = true;
  PrecisionDecision precision;
  std::vector<StepOutcome> steps;
};
// One line: what the level applied beyond O0's placement, or that it applied nothing more (every
// step above O0 skipped, each with its reason in `steps`).
std::string summary(const OptimizationReport& report);
std::string to_json_text(const OptimizationReport& report, int indent = -1);

class UnifiedManager {
 public:
  // Chooses the backend ("auto": BackendRegistry::detect_best_backend), checks the device index
  // and decides the precision; every refusal raises here, before any model is touched.
  explicit UnifiedManager(TorchBridgeConfig config = TorchBridgeConfig::for_training());

  const TorchBridgeConfig& config() const { return config_; }
  const Backend& backend() const { return *backend_; }
  c10::Device device() const;
  const PrecisionDecision& precision() const { return precision_; }
  // The dtype autocast should compute in, when the configured level and precision use autocast.
  std::optional<c10::ScalarType> autocast_dtype() const;
  // The autocast the configured level and precision use, on this manager's device type, for the
  // caller's forward pass (and loss); where they use none (fp32, O0/O1), a scope with autocast
  // off, so the region computes in the configured precision either way.
  amp::AutocastScope autocast() const;

  // The plan for a model with `traits` under this manager's configuration, device and precision
  // (what the Python package executes; optimize() executes it for LibTorch modules).
  std::vector<PlannedStep> plan(const ModelTraits& traits) const;

  // Places `module` on the device and applies the configured level. `optimizer` (optional) is
  // reported on; LibTorch's optimizers have nothing to fuse.
  const OptimizationReport& optimize(torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr);
  // TorchScript: frozen and optimized for inference at O1+ when not training; returns the module
  // to use from now on (freezing makes a new one).
  torch::jit::Module optimize(const torch::jit::Module& module);
  // O2's compilation for C++: an AOTInductor package (compiled_model.h) loaded for this manager's
  // device. Raises c10::ValueError below O2 (compilation is an O2 step) and for a package compiled
  // for another device type. The report says what was loaded.
  CompiledModel load_compiled(const std::string& package_path);

  // The report of the last optimize() or load_compiled() call (empty steps before the first).
  const OptimizationReport& report() const { return report_; }

 private:
  OptimizationReport start_report() const;

  TorchBridgeConfig config_;
  std::shared_ptr<Backend> backend_;
  DeviceInfo device_info_;
  PrecisionDecision precision_;
  OptimizationReport report_;
};

}  // namespace torchbridge

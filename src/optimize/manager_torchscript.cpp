// The TorchScript half of UnifiedManager, in its own translation unit: the jit module headers are
// among the costliest we include.
#include <torchbridge/optimize/manager.h>

#include "optimize/process_settings.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/module.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {

torch::jit::Module UnifiedManager::optimize(const torch::jit::Module& module) {
  ModelTraits traits;
  traits.torchscript = true;
  for (const auto& child : module.modules()) {
    const std::string type = child.type()->name() ? child.type()->name()->qualifiedName() : "";
    if (type.find("Conv2d") != std::string::npos) traits.has_convolutions = true;
    if (type.find("Linear") != std::string::npos) traits.has_linear = true;
  }
  const auto steps = plan(traits);
  OptimizationReport report = start_report();
  torch::jit::Module result = module.clone();
  for (const PlannedStep& step : steps) {
    StepOutcome outcome{step.name, step.level, step.apply ? "applied" : "skipped", step.reason};
    if (!step.apply || optimize_detail::apply_process_setting(step)) {
      report.steps.push_back(std::move(outcome));
      continue;
    }
    if (step.name == "place") {
      result.to(device());
    } else if (step.name == "freeze_torchscript") {
      TORCH_CHECK_VALUE(!module.is_training(), "freeze_torchscript: the configuration says inference (training = "
                        "false) but the TorchScript module is in training mode; call eval() first");
      result = torch::jit::optimize_for_inference(result);  // freezes first, as torch.jit.optimize_for_inference
    } else if (step.name == "channels_last") {
      outcome.outcome = "skipped";
      outcome.detail = "TorchScript: convolution weights keep their layout (optimize_for_inference chooses it when frozen)";
    } else if (step.name.starts_with("hardware.")) {
      if (const auto elsewhere = optimize_detail::hardware_step_outside_cpp(step)) {
        outcome.outcome = "skipped";
        outcome.detail += "; " + *elsewhere;
      }
    } else {
      TORCH_CHECK(false, "the optimization plan has a step '", step.name, "' the TorchScript executor does not know");
    }
    report.steps.push_back(std::move(outcome));
  }
  report_ = std::move(report);
  return result;
}

}  // namespace torchbridge

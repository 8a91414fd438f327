#include <torchbridge/optimize/manager.h>

#include "optimize/process_settings.h"

#include <torchbridge/amp/fp8_conversion.h>
#include <torchbridge/json_text.h>
#include <torchbridge/precision.h>
#include <torchbridge/registry.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

// fp64 means the module computes in float64 as given: optimize lowers nothing and casts nothing up
// (float32 inputs would then not match), so a module with other floating-point parameters would
// compute in their precision under a report saying float64.
void check_computes_in_float64(const torch::nn::Module& module) {
  std::set<std::string> others;
  for (const at::Tensor& parameter : module.parameters()) {
    if (parameter.is_floating_point() && parameter.scalar_type() != at::kDouble) {
      others.insert(c10::toString(parameter.scalar_type()));
    }
  }
  std::string listed;
  for (const std::string& name : others) listed += (listed.empty() ? "" : ", ") + name;
  TORCH_CHECK_VALUE(others.empty(), "precision fp64: the module's floating-point parameters are ", listed,
                    ", so it would compute in that precision; cast it with module->to(torch::kFloat64) (and give it "
                    "float64 inputs) before optimize, or ask for fp32");
}

// LibTorch optimizers carry no class name at run time; the plan only needs it for its report.
std::string optimizer_name(const torch::optim::Optimizer* optimizer) {
  if (optimizer == nullptr) return "";
  if (dynamic_cast<const torch::optim::AdamW*>(optimizer)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::SGD*>(optimizer)) return "SGD";
  if (dynamic_cast<const torch::optim::Adagrad*>(optimizer)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(optimizer)) return "RMSprop";
  if (dynamic_cast<const torch::optim::LBFGS*>(optimizer)) return "LBFGS";
  return "Optimizer";
}

ModelTraits traits_of(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer) {
  ModelTraits traits;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (child->as<torch::nn::Conv2d>()) traits.has_convolutions = true;
    if (child->as<torch::nn::Linear>()) traits.has_linear = true;
  }
  traits.optimizer = optimizer_name(optimizer);
  return traits;
}

// The module's own parameters (and buffers, when asked), replaced in place (set_data keeps the
// parameter objects, so optimizers holding them stay valid).
template <typename Transform>
void transform_own_tensors(torch::nn::Module& module, Transform transform, bool buffers) {
  for (auto& parameter : module.parameters(/*recurse=*/false)) {
    if (auto replacement = transform(parameter)) parameter.set_data(*replacement);
  }
  if (!buffers) return;
  for (auto& buffer : module.buffers(/*recurse=*/false)) {
    if (auto replacement = transform(buffer)) buffer.set_data(*replacement);
  }
}

// Autocast runs normalization layers in float32 whatever their weights are, and their kernels
// refuse float32 inputs with bfloat16 weights ("mixed dtype (CPU)"), so low_precision_weights
// leaves them float32 (as the Python executor does). Returns the layer's type name, or nothing.
std::optional<std::string> float32_layer(torch::nn::Module& module) {
  using namespace torch::nn;
  if (dynamic_cast<LayerNormImpl*>(&module) || dynamic_cast<GroupNormImpl*>(&module) ||
      dynamic_cast<BatchNorm1dImpl*>(&module) || dynamic_cast<BatchNorm2dImpl*>(&module) ||
      dynamic_cast<BatchNorm3dImpl*>(&module) || dynamic_cast<InstanceNorm1dImpl*>(&module) ||
      dynamic_cast<InstanceNorm2dImpl*>(&module) || dynamic_cast<InstanceNorm3dImpl*>(&module)) {
    std::string name = module.name();  // "torch::nn::LayerNormImpl"
    if (name.starts_with("torch::nn::")) name = name.substr(11);
    return name.ends_with("Impl") ? name.substr(0, name.size() - 4) : name;
  }
  return std::nullopt;
}

// Casts the real floating-point tensors of every layer but normalization layers (complex ones
// too stay: a cast to a real dtype drops the imaginary part); returns what it did.
std::string cast_weights(torch::nn::Module& root, c10::ScalarType dtype) {
  std::set<std::string> kept;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (const auto name = float32_layer(*module)) {
      kept.insert(*name);
      continue;
    }
    transform_own_tensors(*module, [dtype](const at::Tensor& t) -> std::optional<at::Tensor> {
      if (!t.is_floating_point()) return std::nullopt;  // integer counters and complex tensors keep their dtype
      return t.to(dtype);
    }, /*buffers=*/true);
  }
  std::string detail = std::string("inference: floating-point parameters and buffers cast to ") +
                       (dtype == c10::ScalarType::Half ? "float16" : "bfloat16");
  if (kept.empty()) return detail;
  std::string names;
  for (const auto& name : kept) names += (names.empty() ? "" : ", ") + name;
  return detail + ", except in " + names + " layers, which autocast runs in float32";
}

// "3 Linear layer(s) converted; 1 skipped (head: ...)", or why none could be.
std::string fp8_outcome(const amp::Fp8ConversionReport& report) {
  std::string skipped;
  for (const auto& layer : report.skipped) skipped += (skipped.empty() ? "" : "; ") + layer.name + ": " + layer.reason;
  if (report.converted.empty()) return "no Linear layer could be converted (" + skipped + ")";
  std::string text = std::to_string(report.converted.size()) + " Linear layer(s) converted";
  if (!skipped.empty()) text += "; " + std::to_string(report.skipped.size()) + " skipped (" + skipped + ")";
  return text;
}

c10::ScalarType dtype_named(const std::string& name) {
  return name == "float16" ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

}  // namespace

namespace {

std::string steps_summary(const OptimizationReport& report) {
  const std::string level = to_string(report.level);
  if (report.level == OptLevel::O0) return "O0 on " + report.device + ": placed on the device, nothing else";
  std::string beyond;
  for (const auto& step : report.steps) {
    if (step.level == OptLevel::O0 || step.outcome == "skipped") continue;
    beyond += (beyond.empty() ? "" : ", ") + step.name;
  }
  if (beyond.empty()) {
    return level + " applied nothing beyond O0 on " + report.device + ": every step of O1-" + level +
           " was skipped, each for the reason shown";
  }
  return level + " on " + report.device + " applied " + beyond;
}

}  // namespace

std::string summary(const OptimizationReport& report) {
  const Precision precision = report.precision.precision;
  const bool low = precision == Precision::kBf16 || precision == Precision::kFp16 || precision == Precision::kFp8;
  // A low precision decided or named at O0/O1 changes nothing yet: said, as the Python report does.
  if (!low || report.level >= OptLevel::O2) return steps_summary(report);
  return steps_summary(report) + "; precision " + name_of(precision) + " takes effect from O2 (autocast), so at " +
         to_string(report.level) + " the model computes in its own dtypes";
}

std::string to_json_text(const OptimizationReport& report, int indent) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& step : report.steps) {
    steps.push_back({{"name", step.name}, {"level", to_string(step.level)}, {"outcome", step.outcome},
                     {"detail", step.detail}});
  }
  return nlohmann::json{{"backend", report.backend},
                        {"device", report.device},
                        {"level", to_string(report.level)},
                        {"training", report.training},
                        {"precision", nlohmann::json::parse(to_json_text(report.precision, {}))},
                        {"steps", steps},
                        {"summary", summary(report)}}
      .dump(indent);
}

UnifiedManager::UnifiedManager(TorchBridgeConfig config) : config_(std::move(config)) {
  validate(config_);
  const BackendRegistry& registry = BackendRegistry::instance();
  backend_ = registry.create(config_.backend == "auto" ? registry.detect_best_backend() : config_.backend);
  device_info_ = backend_->info(config_.device_index);  // checks the index against the device count
  hardware_notes(config_.hardware, device_info_);        // refuses what the device cannot do, now
  const bool matrix_cores_off = !config_.hardware.amd.enable_matrix_cores && device_info_.backend == "rocm";
  if (!matrix_cores_off) {
    precision_ = decide_precision(device_info_, config_.precision);
    return;
  }
  TORCH_CHECK_VALUE(config_.precision == "auto" || config_.precision == "fp32" || config_.precision == "fp64",
                    "precision '", config_.precision, "' runs on the matrix cores, which hardware.amd.enable_matrix_cores "
                    "= false turns off; use fp32 or auto");
  precision_ = decide_precision(device_info_, config_.precision == "auto" ? "fp32" : config_.precision);
  if (config_.precision == "auto") {
    precision_.requested = "auto";
    precision_.reason = "hardware.amd.enable_matrix_cores is false: " + precision_.reason;
  }
}

c10::Device UnifiedManager::device() const { return backend_->device(config_.device_index); }

std::vector<PlannedStep> UnifiedManager::plan(const ModelTraits& traits) const {
  return plan_optimization(config_, device_info_, precision_, traits);
}

std::optional<c10::ScalarType> UnifiedManager::autocast_dtype() const {
  for (const auto& step : plan(ModelTraits{})) {
    if (step.name == "autocast" && step.apply) return dtype_named(step.argument);
  }
  return std::nullopt;
}

amp::AutocastScope UnifiedManager::autocast() const {
  const std::optional<c10::ScalarType> dtype = autocast_dtype();
  amp::AutocastOptions options;
  options.enabled = dtype.has_value();
  options.dtype = dtype;
  return amp::AutocastScope(device().type(), options);
}

OptimizationReport UnifiedManager::start_report() const {
  OptimizationReport report;
  report.backend = backend_->name();
  report.device = device().str();
  report.level = config_.optimization_level;
  report.training = config_.training;
  report.precision = precision_;
  return report;
}

const OptimizationReport& UnifiedManager::optimize(torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  if (precision_.precision == Precision::kFp64) check_computes_in_float64(module);
  const auto steps = plan(traits_of(module, optimizer));
  OptimizationReport report = start_report();
  for (const PlannedStep& step : steps) {
    StepOutcome outcome{step.name, step.level, step.apply ? "applied" : "skipped", step.reason};
    if (!step.apply || optimize_detail::apply_process_setting(step)) {
      report.steps.push_back(std::move(outcome));
      continue;
    }
    if (step.name == "place") {
      module.to(device());
    } else if (step.name == "channels_last") {
      // Parameters only: a model may read a 4-D buffer with view(), which a restrided one refuses.
      for (const auto& layer : module.modules(/*include_self=*/true)) {
        transform_own_tensors(*layer, [](const at::Tensor& t) -> std::optional<at::Tensor> {
          if (t.dim() != 4) return std::nullopt;
          return t.contiguous(at::MemoryFormat::ChannelsLast);
        }, /*buffers=*/false);
      }
    } else if (step.name == "low_precision_weights") {
      outcome.detail = cast_weights(module, dtype_named(step.argument));
    } else if (step.name == "fp8") {
      const amp::Fp8ConversionReport converted = amp::convert_to_fp8(module);
      if (converted.converted.empty()) outcome.outcome = "skipped";
      outcome.detail = fp8_outcome(converted);
    } else if (step.name.starts_with("hardware.")) {
      if (const auto elsewhere = optimize_detail::hardware_step_outside_cpp(step)) {
        outcome.outcome = "skipped";
        outcome.detail += "; " + *elsewhere;
      }
    } else if (step.name == "autocast") {
      outcome.outcome = "caller";
      outcome.detail += "; C++ modules have no forward to wrap: run forward inside manager.autocast()";
    } else if (step.name == "activation_checkpointing") {
      outcome.outcome = "caller";
      outcome.detail += "; a C++ module's forward is compiled code: put its blocks in "
                        "memory::CheckpointedSequential, or run them through memory::checkpoint (docs/memory.md)";
    } else {
      TORCH_CHECK(false, "the optimization plan has a step '", step.name, "' the C++ executor does not know");
    }
    report.steps.push_back(std::move(outcome));
  }
  report_ = std::move(report);
  return report_;
}

CompiledModel UnifiedManager::load_compiled(const std::string& package_path) {
  TORCH_CHECK_VALUE(config_.optimization_level >= OptLevel::O2, "load_compiled: compilation is an O2 step, and the "
                    "configuration's optimization_level is ", to_string(config_.optimization_level));
  CompiledModel model(package_path, device());
  OptimizationReport report = start_report();
  report.steps.push_back({"compile", OptLevel::O2, "applied",
                          "AOTInductor package " + package_path + " loaded for " + device().str() + " (" +
                              std::to_string(model.input_count()) +
                              " input tensor(s)); its precision and layouts were fixed when it was compiled"});
  report_ = std::move(report);
  return model;
}

}  // namespace torchbridge

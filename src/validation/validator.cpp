#include <torchbridge/validation/validator.h>

#include "validation/backend_validation.h"
#include "validation/comparison.h"
#include "validation/reference.h"
#include "validation/report_text.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/process_isolation.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <exception>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::validation {
namespace {

// The model with every placed copy set to checkpointed training (ValidatorOptions::checkpointing).
class CheckpointedTraining final : public ModelSource {
 public:
  explicit CheckpointedTraining(const ModelSource& model) : model_(model) {}
  std::string kind() const override { return model_.kind(); }
  std::unique_ptr<PlacedModel> place(c10::Device device, c10::ScalarType dtype,
                                     std::optional<c10::ScalarType> round_through) const override {
    auto placed = model_.place(device, dtype, round_through);
    placed->set_checkpointed_training(true);
    return placed;
  }

 private:
  const ModelSource& model_;
};

}  // namespace

void PlacedModel::set_checkpointed_training(bool checkpointed) {
  TORCH_CHECK_VALUE(!checkpointed, "this kind of model cannot be validated with checkpointed training (TorchScript "
                    "and torch::nn models can); checkpoint inside the model instead");
}

int ValidationReport::passed() const {
  int count = 0;
  for (const auto& check : checks) count += check.passed ? 1 : 0;
  return count;
}

namespace {
constexpr std::pair<CheckKind, const char*> kCheckNames[] = {
    {CheckKind::kRun, "run"},           {CheckKind::kOutput, "output"},
    {CheckKind::kGradient, "gradient"}, {CheckKind::kFinite, "finite"},
    {CheckKind::kDeterminism, "determinism"}, {CheckKind::kRoundTrip, "round_trip"},
    {CheckKind::kMemory, "memory"},
};
}  // namespace

const char* check_name(CheckKind kind) {
  for (const auto& [k, name] : kCheckNames) {
    if (k == kind) return name;
  }
  TORCH_CHECK(false, "check kind ", static_cast<int>(kind), " has no name");
}

CheckKind parse_check_kind(const std::string& name) {
  std::string valid;
  for (const auto& [kind, known] : kCheckNames) {
    if (name == known) return kind;
    valid += (valid.empty() ? "" : ", ") + std::string(known);
  }
  TORCH_CHECK_VALUE(false, "unknown check '", name, "': expected one of ", valid);
}

Precision validation_precision(const std::string& name) {
  const Precision precision = parse_precision_or_dtype_name(name);
  TORCH_CHECK_VALUE(!spec_of(precision).tf32_matmuls, "precision '", name,
                    "' cannot be validated on its own: fp32 on a CUDA GPU with TF32 switched on is held to the tf32 "
                    "bound; choose fp64, fp32, bf16, fp16 or fp8");
  return precision;
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      shape.push_back(parse_integer(item, "size", 1));
    } catch (const c10::ValueError&) {
      TORCH_CHECK_VALUE(false, "input shape '", text,
                        "' is not a comma-separated list of positive integers (bad entry '", item, "')");
    }
  }
  TORCH_CHECK_VALUE(!shape.empty() && text.back() != ',', "input shape '", text,
                    "' is not a comma-separated list of positive integers");
  return shape;
}

Validator::Validator(ValidatorOptions options) : options_(std::move(options)) {
  TORCH_CHECK_VALUE(!options_.backends.empty(), "no backends to validate on");
  TORCH_CHECK_VALUE(!spec_of(options_.precision).tf32_matmuls, "the validator does not run tf32 on its own: fp32 "
                    "on a CUDA GPU with TF32 switched on is held to the tf32 bound");
  check_backends_can_share_a_process(options_.backends, "validate");
  for (const auto& name : options_.backends) backends_.push_back(create_backend(name));
}

namespace {

std::vector<at::Tensor> generated_inputs(const std::vector<std::vector<int64_t>>& shapes, uint64_t seed) {
  TORCH_CHECK_VALUE(!shapes.empty(), "no input shapes given");
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> inputs;
  for (const auto& shape : shapes) inputs.push_back(at::randn(shape, generator, at::TensorOptions()));
  return inputs;
}

}  // namespace

ValidationReport Validator::validate(const ModelSource& model, const std::vector<std::vector<int64_t>>& shapes) const {
  return validate(model, generated_inputs(shapes, options_.seed));
}

std::vector<CheckRecord> check_compiled(const ModelSource& model, const std::vector<std::vector<int64_t>>& shapes,
                                        uint64_t seed, const std::string& name, c10::Device device,
                                        const CompiledRun& run) {
  const std::vector<at::Tensor> inputs = generated_inputs(shapes, seed);
  // Forward only, in float64 on the same float32 values.
  const RunResult reference = model.place(c10::Device(c10::kCPU), at::kDouble)->run(inputs, OutputWeights());
  std::vector<CheckRecord> checks;
  const std::string where = device.str();
  std::vector<at::Tensor> outputs;
  try {
    std::vector<at::Tensor> placed;
    for (const auto& input : inputs) placed.push_back(input.to(device));
    outputs = run(placed);
  } catch (const std::exception& e) {
    checks.push_back({name, where, CheckKind::kRun, "model", false, std::nullopt, error_summary(e.what())});
    return checks;
  }
  const bool same_count = outputs.size() == reference.outputs.size();
  checks.push_back({name, where, CheckKind::kRun, "model", same_count,
                    std::nullopt,
                    same_count ? "ran" : "returned " + std::to_string(outputs.size()) + " outputs, the model " +
                                             std::to_string(reference.outputs.size())});
  if (!same_count) return checks;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string subject = "output " + std::to_string(i);
    const at::Tensor result = outputs[i].cpu();
    if (result.sizes() != reference.outputs[i].sizes()) {
      std::ostringstream detail;
      detail << "shape " << result.sizes() << ", the model's " << reference.outputs[i].sizes();
      checks.push_back({name, where, CheckKind::kOutput, subject, false, std::nullopt, detail.str()});
      continue;
    }
    const OutputCheck check = check_output(result, reference.outputs[i], Precision::kFp32);
    std::ostringstream detail;
    detail << (check.within ? "within" : "outside") << " the fp32 bound: relative L2 error "
           << check.metrics.rel_l2_error << ", cosine " << check.metrics.cosine_similarity;
    checks.push_back({name, where, CheckKind::kOutput, subject, check.within, check.metrics, detail.str()});
  }
  return checks;
}

ValidationReport Validator::validate(const ModelSource& given, const std::vector<at::Tensor>& inputs) const {
  const CheckpointedTraining checkpointed(given);
  const ModelSource& model = options_.checkpointing ? static_cast<const ModelSource&>(checkpointed) : given;
  ValidationReport report;
  report.checkpointing = options_.checkpointing;
  report.model_kind = model.kind();
  report.precision = options_.precision;
  report.backends = options_.backends;
  // The reference; per backend: run, determinism and round trip, compare, memory.
  const int total = 1 + 4 * static_cast<int>(backends_.size());
  int done = 0;
  const auto progress = [&](const std::string& backend, const std::string& step) {
    if (options_.progress) options_.progress(backend, step, done, total);
    ++done;
  };
  // Inputs rounded to the compute precision: the reference and the backends start from the
  // same values, so a comparison measures the backends' arithmetic.
  const PrecisionSpec& spec = spec_of(options_.precision);
  const c10::ScalarType compute = spec.compute;
  std::vector<at::Tensor> rounded_inputs;
  for (const auto& input : inputs) {
    rounded_inputs.push_back(at::isFloatingType(input.scalar_type()) ? input.to(compute).to(input.scalar_type())
                                                                     : input);
  }
  const OutputWeights weights = seeded_weights(options_.seed + 1, compute);
  progress("cpu", "reference");
  // Joined before this function returns, also when it throws (the future from std::async waits).
  const std::shared_future<Reference> reference = start_reference(model, rounded_inputs, weights, spec.storage);
  for (size_t b = 0; b < backends_.size(); ++b) {
    const std::string& name = options_.backends[b];
    const auto start = Clock::now();
    validate_backend(name, *backends_[b], model, rounded_inputs, weights, reference, options_.precision, report,
                     [&](const std::string& step) { progress(name, step); });
    report.timings.push_back({name, seconds_since(start)});
  }
  report.reference_seconds = reference.get().seconds;
  report.reference = reference.get().description;
  if (options_.progress) options_.progress("", "done", total, total);
  return report;
}

}  // namespace torchbridge::validation

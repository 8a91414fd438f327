#pragma once
// Cross-backend validation: does a model compute the same thing on each backend as on a trusted
// reference (the CPU in float64)? The validator runs the model's forward and backward on the
// reference and on every selected backend and records one check per comparison:
//   run          the model ran on the backend at all (a failure ends that backend's checks)
//   output       each output against the reference (max abs/rel error, cosine similarity)
//   gradient     each parameter's gradient against the reference
//   finite       no NaN/Inf in outputs or gradients
//   determinism  a second run on the same copy gives the same results
//   round_trip   the copy saved in its own format and reloaded on the device reproduces the outputs
//   memory       the device's allocator and free memory return to their baselines: across the
//                second run on every device, and over the whole validation where the device's
//                libraries keep no workspaces (SDK devices)
// Precisions and their tolerances come from one table (<torchbridge/precision.h>).

#include <torchbridge/precision.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace c10 {
struct IValue;
}
namespace torch::jit {
struct Module;
}
namespace torch::nn {
class AnyModule;
}

namespace torchbridge {
class Backend;
}

namespace torchbridge::validation {

// What one run produced, copied to the CPU.
struct RunResult {
  std::vector<at::Tensor> outputs;
  std::vector<std::pair<std::string, at::Tensor>> gradients;  // parameter name -> gradient
};

// The weights of the loss whose gradients are compared, as a function of the outputs' shapes (so
// one forward pass suffices, even on the reference). Always the same for the same shapes.
using OutputWeights = std::function<std::vector<at::Tensor>(const std::vector<std::vector<int64_t>>& shapes)>;

// One independent copy of a model on one device, in one dtype.
class PlacedModel {
 public:
  virtual ~PlacedModel() = default;
  // Moves `inputs` (CPU tensors) to the copy's device, casting floating-point ones to its dtype,
  // and runs forward. With `output_weights` (given the outputs' shapes, one CPU tensor per
  // output), also runs backward of the loss sum_i sum(output_i * weight_i); an empty function
  // means forward only. Random weights (rather than a plain sum) keep gradients from cancelling:
  // the sum of a layer-normalised output, for one, has a zero gradient. Returns the outputs and
  // the gradients of parameters that require them, on the CPU. Earlier gradients are cleared.
  virtual RunResult run(const std::vector<at::Tensor>& inputs, const OutputWeights& output_weights) = 0;
  // From now on (and in copies save_and_reload makes), run the forward pass of a run with output
  // weights as one checkpointed region (torchbridge::memory::checkpoint), so the gradients come
  // from a recomputed backward. Model kinds that cannot raise c10::ValueError (the default).
  virtual void set_checkpointed_training(bool checkpointed);
  // This copy written in the model's own serialized form and read back onto the same device.
  virtual std::unique_ptr<PlacedModel> save_and_reload() const = 0;
};

// A model of any kind the validator can place on devices; placing never changes the source.
// The validator places and runs the CPU float64 reference on a thread of its own while the
// backends' copies are placed and run: place() and the runs of different copies must allow being
// called from two threads at once (the model kinds built in do; the Python one takes the GIL).
class ModelSource {
 public:
  virtual ~ModelSource() = default;
  virtual std::string kind() const = 0;  // e.g. "TorchScript", "torch::nn", "Python nn.Module"
  // With `round_through`, floating-point parameters and buffers are first rounded to that dtype
  // and then cast to `dtype`: the reference computes in float64 on exactly the values a
  // low-precision backend holds, so only the arithmetic is compared, not the storage rounding.
  virtual std::unique_ptr<PlacedModel> place(c10::Device device, c10::ScalarType dtype,
                                             std::optional<c10::ScalarType> round_through = std::nullopt) const = 0;
};

// A TorchScript module (scripted, traced, or torch::jit::load-ed); it is deep-copied per device.
std::unique_ptr<ModelSource> model_from(const torch::jit::Module& module);
// The tensors a TorchScript module's forward returned, in order: a tensor, or tuples and lists
// of them, nested. Anything else raises, naming what it is.
std::vector<at::Tensor> output_tensors(const c10::IValue& value);
// A torch::nn module whose forward takes one to three tensors and returns a tensor, held in an
// AnyModule (so not nn::Sequential itself, whose forward is a template: wrap it in a module).
// It must derive from torch::nn::Cloneable<T>: copies for each device come from clone().
std::unique_ptr<ModelSource> model_from(const torch::nn::AnyModule& module);

struct Metrics {
  double max_abs_error = 0;
  double max_rel_error = 0;      // max_abs_error / max |reference|
  double rel_l2_error = 0;       // ||result - reference|| / ||reference||
  double cosine_similarity = 1;
};

// One result against its reference (same shape; compared in float64) under `precision`'s output
// bound: the rule every output check of the Validator applies, for callers that run the model
// themselves (the Python UnifiedManager's validate step).
struct OutputCheck {
  Metrics metrics;
  bool within = false;
};
OutputCheck check_output(const at::Tensor& result, const at::Tensor& reference, Precision precision);

// What a check looked at (the header comment above says what each means). Reports name them
// "run", "output", "gradient", "finite", "determinism", "round_trip", "memory".
enum class CheckKind { kRun, kOutput, kGradient, kFinite, kDeterminism, kRoundTrip, kMemory };
const char* check_name(CheckKind kind);
// The kind a report names; anything else raises c10::ValueError listing the names.
CheckKind parse_check_kind(const std::string& name);

struct CheckRecord {
  std::string backend;  // as the user named it, e.g. "emu"
  std::string device;   // e.g. "emu:0"
  CheckKind check = CheckKind::kRun;
  std::string subject;  // e.g. "output 0", "layers.0.weight"
  bool passed = false;
  std::optional<Metrics> metrics;  // for comparisons
  std::string detail;              // what was measured, or why it failed
};

struct BackendTiming {
  std::string backend;
  double seconds = 0;  // everything the validator did on this backend, including any wait for the
                       // reference (computed meanwhile on its own thread) before the comparisons
};

struct ValidationReport {
  std::string model_kind;
  Precision precision = Precision::kFp32;  // on the backends: fp64, fp32, bf16, fp16 or fp8
  std::string reference;  // e.g. "cpu float64"
  bool checkpointing = false;  // ValidatorOptions::checkpointing
  std::vector<std::string> backends;
  std::vector<CheckRecord> checks;
  std::vector<std::string> not_checked;  // checks that do not apply, each with the reason
  std::vector<BackendTiming> timings;
  double reference_seconds = 0;

  int total_tests() const { return static_cast<int>(checks.size()); }
  int passed() const;
  int failed() const { return total_tests() - passed(); }
  bool is_valid() const { return total_tests() > 0 && failed() == 0; }
};

struct ValidatorOptions {
  std::vector<std::string> backends = {"cpu"};  // names or aliases, as `torchbridge info` lists them
  Precision precision = Precision::kFp32;       // fp64, fp32, bf16, fp16 or fp8 (weights); not tf32
  uint64_t seed = 0;                            // for generated inputs
  // Train through activation checkpointing on every device, the reference included (each forward
  // pass with gradients is one checkpointed region): the comparisons then cover the recomputed
  // backward (`validate --checkpointing`).
  bool checkpointing = false;
  // Called before each step, e.g. ("emu", "determinism", 3, 12); for progress displays.
  std::function<void(const std::string& backend, const std::string& step, int done, int total)> progress;
};

// Runs a model compiled ahead of time (an AOTInductor package through
// torchbridge::CompiledModel::run, say) on inputs already on its device; returns its outputs.
using CompiledRun = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

class Validator {
 public:
  // Resolves every backend now (an SDK device such as emu is loaded), so an unknown or
  // unavailable backend or precision raises before any work is done.
  explicit Validator(ValidatorOptions options);

  ValidationReport validate(const ModelSource& model, const std::vector<at::Tensor>& inputs) const;
  // Inputs drawn from a standard normal distribution (seeded by options.seed) in these shapes.
  ValidationReport validate(const ModelSource& model, const std::vector<std::vector<int64_t>>& input_shapes) const;

  const ValidatorOptions& options() const { return options_; }

 private:
  ValidatorOptions options_;
  std::vector<std::shared_ptr<Backend>> backends_;  // one per options_.backends entry
};

// The compiled form of `model` against `model`'s float64 CPU reference, on the inputs a
// Validator with this `seed` generates for `shapes` (float32, moved to `device`): a "run" check,
// then an "output" check per output under fp32's bound (a package computes in the dtype it was
// compiled for), each under the backend name `name` (e.g. "compiled").
std::vector<CheckRecord> check_compiled(const ModelSource& model, const std::vector<std::vector<int64_t>>& shapes,
                                        uint64_t seed, const std::string& name, c10::Device device,
                                        const CompiledRun& run);

// The precision `name` names, if the validator can run it: tf32 is not one (fp32 on CUDA runs its
// matmuls in TF32 and is held to the tf32 bound). Raises naming the valid ones.
Precision validation_precision(const std::string& name);
// "[8, 16, 32]"-style parsing of "8,16,32"; each size a positive integer. Raises naming the text.
std::vector<int64_t> parse_shape(const std::string& text);

}  // namespace torchbridge::validation

namespace torchbridge::validation {
// The report as JSON (schema in docs/cli-json.md): every check with every measured value.
// Non-finite errors are written as null (JSON has no NaN or Infinity).
std::string report_json(const ValidationReport& report, int indent = 2);
// A report read back from report_json()'s text (e.g. from a child process); raises (ValueError)
// naming what is malformed.
ValidationReport report_from_json(const std::string& json);
}  // namespace torchbridge::validation

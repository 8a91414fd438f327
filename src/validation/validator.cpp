#include <torchbridge/validation/validator.h>

#include "validation/comparison.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/process_isolation.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <future>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::validation {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The line of an error worth showing: TorchScript's interpreter puts a generic first line and a
// script traceback before the original error, which comes last.
std::string error_summary(const std::string& text) {
  if (text.find("failed in the TorchScript interpreter") == std::string::npos) return text.substr(0, text.find('\n'));
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  }
  return last;
}

std::string shapes_of(const std::vector<at::Tensor>& inputs) {
  std::ostringstream out;
  for (size_t i = 0; i < inputs.size(); ++i) out << (i ? ", " : "") << inputs[i].sizes();
  return out.str();
}

std::string scientific(double value) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(3) << value;
  return out.str();
}

std::string format_bytes(int64_t bytes) { return std::to_string(bytes) + " B"; }

// Libraries behind these backends (cuBLAS, cuDNN, oneDNN, MPS graphs) allocate workspaces on
// first use and keep them, so device memory cannot be held to where it stood before the model was
// placed. On them the memory check starts after the first (checked) run, which has allocated the
// workspaces, and holds the second run on the reloaded copy to it. That first run includes the
// backward: autograd runs it on its own device thread, and cuBLAS keeps a separate handle and
// workspace (32 MiB on an H100) per thread and stream, which a forward-only first pass would
// have left to be counted as a leak. (This replaced a separate warm-up run: one device pass less.)
bool keeps_library_workspaces(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA || type == c10::DeviceType::XPU || type == c10::DeviceType::MPS;
}
// On SDK devices the validator is the only user of device memory in this process, so the
// device's own free-memory figure must come back too; that is what catches a runtime that
// loses freed memory. A CUDA device is shared with other processes, so only torch's allocator
// statistics are compared there.
bool check_device_free_memory(c10::DeviceType type) { return type == c10::DeviceType::PrivateUse1; }
// CPU and SDK devices (whose kernels are the CPU's) give bitwise identical repeated runs; GPU
// kernels may reduce in a different order from run to run (atomics), so they get the tolerance.
bool bitwise_deterministic(c10::DeviceType type) {
  return type == c10::DeviceType::CPU || type == c10::DeviceType::PrivateUse1;
}

struct Reference {
  RunResult result;
  std::string description;
  double seconds = 0;
};

// Standard normal weights from a seed, rounded to the compute precision (like the inputs, so a
// backend holds them exactly), as float64.
// Drawn once per set of shapes and reused by every run; the reference's thread and the
// backends' draw from the same cache, hence the lock.
OutputWeights seeded_weights(uint64_t seed, c10::ScalarType compute) {
  struct Cache {
    std::mutex mutex;
    std::map<std::vector<std::vector<int64_t>>, std::vector<at::Tensor>> weights;
  };
  auto cache = std::make_shared<Cache>();
  return [seed, compute, cache](const std::vector<std::vector<int64_t>>& shapes) {
    const std::lock_guard<std::mutex> lock(cache->mutex);
    auto& weights = cache->weights[shapes];
    if (weights.empty()) {
      at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
      for (const auto& shape : shapes) {
        const at::Tensor w = at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble));
        weights.push_back(w.to(compute).to(at::kDouble));
      }
    }
    return weights;
  };
}

// The model on the CPU in float64, or float32 when it cannot run in float64 (e.g. it casts
// internally), holding its parameters rounded to the compute precision.
Reference run_reference(const ModelSource& model, const std::vector<at::Tensor>& inputs,
                        const OutputWeights& weights, c10::ScalarType storage) {
  const auto start = Clock::now();
  Reference reference;
  std::string float64_error;
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    try {
      auto placed = model.place(c10::Device(c10::kCPU), dtype, storage);
      reference.result = placed->run(inputs, weights);
      reference.description = dtype == at::kDouble
                                  ? "cpu float64"
                                  : "cpu float32 (the model does not run in float64: " + float64_error + ")";
      reference.seconds = seconds_since(start);
      return reference;
    } catch (const std::exception& e) {
      if (dtype == at::kDouble) {
        float64_error = error_summary(e.what());
        continue;
      }
      TORCH_CHECK_VALUE(false, "the model does not run on the CPU with inputs of shape ", shapes_of(inputs), ": ",
                        error_summary(e.what()));
    }
  }
  TORCH_CHECK(false, "unreachable");
}

// The reference on a thread of its own, started before the backends' runs and awaited only where
// a backend's results are compared with it: the CPU computes it while the devices run (on a GPU,
// the float64 reference alone took three times one forward+backward on the device). The thread
// carries the caller's thread-local state (grad mode, dispatch settings) and intra-op thread count.
std::shared_future<Reference> start_reference(const ModelSource& model, const std::vector<at::Tensor>& inputs,
                                              const OutputWeights& weights, c10::ScalarType storage) {
  return std::async(std::launch::async,
                    [&model, &inputs, weights, storage, state = at::ThreadLocalState()] {
                      const at::ThreadLocalStateGuard guard(state);
                      at::init_num_threads();
                      return run_reference(model, inputs, weights, storage);
                    })
      .share();
}

class BackendValidation {
 public:
  BackendValidation(const std::string& name, Backend& backend, const ModelSource& model,
                    const std::vector<at::Tensor>& inputs, const OutputWeights& weights,
                    const std::shared_future<Reference>& reference, Precision precision, ValidationReport& report)
      : name_(name), backend_(backend), device_(backend.device(0)), model_(model), inputs_(inputs), weights_(weights),
        reference_(reference), report_(report),
        tolerance_(spec_of(precision == Precision::kFp32 && device_.is_cuda() ? Precision::kTf32 : precision)),
        dtype_(spec_of(precision).compute), storage_(spec_of(precision).storage) {}

  template <typename Progress>
  void run(const Progress& progress) {
    const bool memory = device_.type() != c10::kCPU;
    if (!memory) {
      report_.not_checked.push_back(name_ + ": memory — the CPU backend's statistics are process RSS, which "
                                    "the C library does not return to a fixed baseline, so no leak check is made");
    }
    // Two windows (keeps_library_workspaces): the whole validation where nothing is kept, and
    // the second run, from after the first run to after the reloaded copy is released, everywhere.
    std::optional<MemoryStats> before_placing, before_second_run, after_second_run;
    if (memory && !keeps_library_workspaces(device_.type())) before_placing = settled_memory();
    {
      progress("run");
      std::unique_ptr<PlacedModel> placed;
      std::optional<RunResult> first;
      try {
        placed = model_.place(device_, dtype_, storage_);
        first = placed->run(inputs_, weights_);
      } catch (const std::exception& e) {
        record(CheckKind::kRun, "model", false, std::nullopt, "failed on " + device_.str() + ": " + error_summary(e.what()));
      }
      // Everything the device does comes before the comparisons with the reference, so that it
      // overlaps the reference's computation on its own thread.
      const size_t device_checks = report_.checks.size();
      if (first) {
        try {
          check_finite(*first);
          if (memory) before_second_run = settled_memory();
          progress("determinism and round trip");
          check_determinism_and_round_trip(*placed, *first);
          if (memory) after_second_run = settled_memory();
        } catch (const std::exception& e) {
          record(CheckKind::kRun, "model", false, std::nullopt,
                 "failed on " + device_.str() + ": " + error_summary(e.what()));
        }
      }
      progress("compare with the reference");
      // Outside the try: an error here is the reference's (the model does not run on the CPU),
      // not this backend's, and ends the whole validation as it would have before any backend ran.
      const Reference& reference = reference_.get();
      if (first) {
        const size_t comparisons = report_.checks.size();
        try {
          compare_outputs(*first, reference);
          compare_gradients(*first, reference);
        } catch (const std::exception& e) {
          record(CheckKind::kRun, "model", false, std::nullopt,
                 "the results from " + device_.str() + " could not be compared with the reference: " +
                     error_summary(e.what()));
        }
        // Reported in the order a reader checks them: outputs and gradients first.
        std::rotate(report_.checks.begin() + static_cast<std::ptrdiff_t>(device_checks),
                    report_.checks.begin() + static_cast<std::ptrdiff_t>(comparisons), report_.checks.end());
      }
    }
    progress("memory");
    if (!memory) return;
    std::vector<MemoryWindow> windows;
    if (before_second_run && after_second_run) {
      windows.push_back({"across the second run (on the reloaded copy)", *before_second_run, *after_second_run});
    }
    if (before_placing) windows.push_back({"from before placing to after releasing both copies", *before_placing,
                                           settled_memory()});
    check_memory(windows);
  }

 private:
  void record(CheckKind check, const std::string& subject, bool passed, std::optional<Metrics> metrics,
              std::string detail) {
    report_.checks.push_back({name_, device_.str(), check, subject, passed, metrics, std::move(detail)});
  }

  void compare_to_reference(CheckKind check, const std::string& subject, const at::Tensor& result,
                            const at::Tensor& reference) {
    if (result.sizes() != reference.sizes()) {
      std::ostringstream detail;
      detail << "shape " << result.sizes() << " but the reference's is " << reference.sizes();
      record(check, subject, false, std::nullopt, detail.str());
      return;
    }
    const Comparison comparison = compare(result, reference);
    const Bound& bound = check == CheckKind::kGradient ? tolerance_.gradient : tolerance_.output;
    const bool passed = within(comparison, bound);
    std::ostringstream detail;
    detail << (passed ? "within " : "outside ") << tolerance_.name << " tolerance: relative L2 error "
           << comparison.metrics.rel_l2_error << " (allowed " << bound.rtol << "), cosine "
           << comparison.metrics.cosine_similarity << " (at least " << bound.min_cosine << ")";
    record(check, subject, passed, comparison.metrics, detail.str());
  }

  void compare_outputs(const RunResult& result, const Reference& reference) {
    const auto& expected = reference.result.outputs;
    if (result.outputs.size() != expected.size()) {
      record(CheckKind::kOutput, "outputs", false, std::nullopt,
             std::to_string(result.outputs.size()) + " outputs, reference has " + std::to_string(expected.size()));
      return;
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      compare_to_reference(CheckKind::kOutput, "output " + std::to_string(i), result.outputs[i], expected[i]);
    }
  }

  void compare_gradients(const RunResult& result, const Reference& reference) {
    std::map<std::string, at::Tensor> got(result.gradients.begin(), result.gradients.end());
    for (const auto& [name, expected] : reference.result.gradients) {
      const auto it = got.find(name);
      if (it == got.end()) {
        record(CheckKind::kGradient, name, false, std::nullopt, "no gradient on " + device_.str() + "; the reference has one");
        continue;
      }
      compare_to_reference(CheckKind::kGradient, name, it->second, expected);
      got.erase(it);
    }
    for (const auto& [name, tensor] : got) {
      record(CheckKind::kGradient, name, false, std::nullopt, "a gradient on " + device_.str() + " but none in the reference");
    }
  }

  void check_finite(const RunResult& result) {
    // One sync for all tensors; the names are looked up only when something is not finite.
    std::vector<at::Tensor> all_finite;
    for (const auto& output : result.outputs) all_finite.push_back(output.isfinite().all());
    for (const auto& [name, grad] : result.gradients) all_finite.push_back(grad.isfinite().all());
    std::string bad;
    if (!all_finite.empty() && !at::stack(all_finite).all().item<bool>()) {
      for (size_t i = 0; i < all_finite.size() && bad.empty(); ++i) {
        if (all_finite[i].item<bool>()) continue;
        bad = i < result.outputs.size() ? "output " + std::to_string(i)
                                        : "gradient of " + result.gradients[i - result.outputs.size()].first;
      }
    }
    record(CheckKind::kFinite, "outputs and gradients", bad.empty(), std::nullopt,
           bad.empty() ? "no NaN or Inf" : bad + " holds NaN or Inf");
  }

  // How two runs differ: the first tensor that differs (empty when none) and the largest
  // difference. Bitwise on backends that are deterministic by construction, else the tolerance.
  struct Difference {
    std::string first;
    double largest = 0;
  };
  Difference difference(const RunResult& a, const RunResult& b, bool gradients) const {
    Difference d;
    const bool bitwise = bitwise_deterministic(device_.type());
    const auto consider = [&](const std::string& what, const at::Tensor& x, const at::Tensor& y) {
      if (x.sizes() != y.sizes()) {
        if (d.first.empty()) d.first = what + " (shape)";
        return;
      }
      if (bitwise && identical(x, y)) return;  // the common case costs one memcmp
      const Comparison c = compare(y, x);
      d.largest = std::max(d.largest, c.metrics.max_abs_error);
      if ((bitwise || !within(c, tolerance_.output)) && d.first.empty()) d.first = what;
    };
    if (a.outputs.size() != b.outputs.size() || (gradients && a.gradients.size() != b.gradients.size())) {
      d.first = "the number of outputs or gradients";
      return d;
    }
    for (size_t i = 0; i < a.outputs.size(); ++i) consider("output " + std::to_string(i), a.outputs[i], b.outputs[i]);
    for (size_t i = 0; gradients && i < a.gradients.size(); ++i) {
      consider("gradient of " + a.gradients[i].first, a.gradients[i].second, b.gradients[i].second);
    }
    return d;
  }

  // Determinism and the save-and-reload round trip from as few runs as possible: the second run
  // is made on the reloaded copy. When it equals the first, both properties hold (the reload is
  // exact and two runs agree); only when it differs does a third run, on the original copy, tell
  // which of the two failed.
  void check_determinism_and_round_trip(PlacedModel& placed, const RunResult& first) {
    const std::string rule = bitwise_deterministic(device_.type()) ? "bitwise identical" : "within the tolerance";
    // Where the kernels are the CPU's (the CPU and SDK devices), a backward pass is as
    // deterministic as its forward, so the repeat runs forward only: the check then costs one
    // forward instead of a forward and backward. GPU backends repeat the backward too, where
    // atomics in reductions make gradients the usual place for run-to-run differences.
    const bool with_gradients = !bitwise_deterministic(device_.type());
    const OutputWeights repeat_weights = with_gradients ? weights_ : OutputWeights();
    const std::string compared = with_gradients ? "outputs and gradients" : "outputs";
    const RunResult reloaded = placed.save_and_reload()->run(inputs_, repeat_weights);
    const Difference after_reload = difference(first, reloaded, with_gradients);
    Metrics reload_metrics;
    reload_metrics.max_abs_error = after_reload.largest;
    if (after_reload.first.empty()) {
      record(CheckKind::kDeterminism, compared, true, reload_metrics,
             "a second run (on the reloaded copy) gave " + compared + " " + rule + " to the first");
      record(CheckKind::kRoundTrip, "save and reload on " + device_.str(), true, reload_metrics,
             "the copy saved and reloaded on " + device_.str() + " reproduced the " + compared + ", " + rule);
      return;
    }
    const RunResult again = placed.run(inputs_, repeat_weights);
    const Difference repeat = difference(first, again, with_gradients);
    Metrics repeat_metrics;
    repeat_metrics.max_abs_error = repeat.largest;
    record(CheckKind::kDeterminism, compared, repeat.first.empty(), repeat_metrics,
           repeat.first.empty() ? "two runs on the same copy were " + rule
                                : "two runs on the same copy differ (must be " + rule + "); first in " + repeat.first +
                                      ", largest difference " + scientific(repeat.largest));
    // A model that is not deterministic cannot be held to bitwise equality after a reload either.
    const Difference versus_repeat = difference(again, reloaded, with_gradients);
    const bool reload_ok = versus_repeat.first.empty() ||
                           (!repeat.first.empty() && within_tolerance(first, reloaded));
    record(CheckKind::kRoundTrip, "save and reload on " + device_.str(), reload_ok, reload_metrics,
           reload_ok ? "the reloaded copy reproduced the results"
                     : "the reloaded copy's results differ from the original copy's; first in " + after_reload.first +
                           ", largest difference " + scientific(after_reload.largest));
  }

  bool within_tolerance(const RunResult& a, const RunResult& b) const {
    if (a.outputs.size() != b.outputs.size()) return false;
    for (size_t i = 0; i < a.outputs.size(); ++i) {
      if (a.outputs[i].sizes() != b.outputs[i].sizes() || !within(compare(b.outputs[i], a.outputs[i]), tolerance_.output)) {
        return false;
      }
    }
    return true;
  }

  // Where the device's own free memory is compared, the allocator's cache is emptied first so
  // that cached blocks count as free; the allocator's own figures need no such step, and on CUDA
  // emptying it would only make the next run allocate from the driver again.
  MemoryStats settled_memory() {
    backend_.synchronize(device_.index());
    if (check_device_free_memory(device_.type())) backend_.empty_cache();
    return backend_.memory_stats(device_.index());
  }

  struct MemoryWindow {
    std::string span;  // e.g. "across the second run (on the reloaded copy)"
    MemoryStats before;
    MemoryStats after;
  };

  void check_memory(const std::vector<MemoryWindow>& windows) {
    if (windows.empty()) {
      report_.not_checked.push_back(name_ + ": memory — the model did not run on " + device_.str() +
                                    ", and this backend's check starts after a first run (its libraries keep "
                                    "workspaces they allocate on first use)");
      return;
    }
    std::ostringstream detail;
    bool passed = true;
    bool measured = false;
    for (const auto& [span, before, after] : windows) {
      std::ostringstream figures;
      if (before.allocated_bytes && after.allocated_bytes) {
        passed = passed && *after.allocated_bytes == *before.allocated_bytes;
        figures << "allocated " << format_bytes(*before.allocated_bytes) << " -> "
                << format_bytes(*after.allocated_bytes);
      }
      if (check_device_free_memory(device_.type()) && before.free_bytes && after.free_bytes) {
        passed = passed && *after.free_bytes == *before.free_bytes;
        figures << (figures.tellp() > 0 ? ", " : "") << "device free " << format_bytes(*before.free_bytes) << " -> "
                << format_bytes(*after.free_bytes);
      }
      if (figures.tellp() == 0) continue;
      measured = true;
      detail << (detail.tellp() > 0 ? "; " : "") << span << ": " << figures.str();
    }
    if (!measured) {
      report_.not_checked.push_back(name_ + ": memory — the backend reports no allocator statistics (" +
                                    windows.front().after.source + ")");
      return;
    }
    record(CheckKind::kMemory, "returns to baseline", passed, std::nullopt, detail.str());
  }

  std::string name_;
  Backend& backend_;
  c10::Device device_;
  const ModelSource& model_;
  const std::vector<at::Tensor>& inputs_;
  const OutputWeights& weights_;  // the loss's weights, the reference's too
  const std::shared_future<Reference>& reference_;
  ValidationReport& report_;
  const PrecisionSpec& tolerance_;  // the bounds the comparisons use
  c10::ScalarType dtype_;
  c10::ScalarType storage_;
};

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
  const Precision precision = parse_precision(name);
  TORCH_CHECK_VALUE(!spec_of(precision).tf32_matmuls, "precision '", name,
                    "' cannot be validated on its own: fp32 on CUDA runs matmuls in TF32 and is held to the tf32 "
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
                    "on CUDA runs matmuls in TF32 and is held to the tf32 bound");
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
    BackendValidation(name, *backends_[b], model, rounded_inputs, weights, reference, options_.precision, report)
        .run([&](const std::string& step) { progress(name, step); });
    report.timings.push_back({name, seconds_since(start)});
  }
  report.reference_seconds = reference.get().seconds;
  report.reference = reference.get().description;
  if (options_.progress) options_.progress("", "done", total, total);
  return report;
}

}  // namespace torchbridge::validation

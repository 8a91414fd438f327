#include "validation/backend_validation.h"

#include "validation/comparison.h"
#include "validation/report_text.h"

#include <torchbridge/backend.h>
#include <torchbridge/memory_stats.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

namespace torchbridge::validation {
namespace {

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

// fp32 on CUDA is held to the tf32 bound where its matmuls or convolutions may run in TF32: an
// sm_80+ GPU with torch's TF32 switch on for cuBLAS or cuDNN (cuDNN's is on by default, cuBLAS's
// off). ROCm and older GPUs compute fp32 in fp32, and are held to fp32's bound.
Precision bound_for(Precision precision, const Backend& backend, c10::Device device) {
  if (precision != Precision::kFp32 || !device.is_cuda()) return precision;
  const auto& context = at::globalContext();
  const bool tf32_switched_on = context.allowTF32CuBLAS() || context.allowTF32CuDNN();
  return tf32_switched_on && backend.info(device.index()).features.tf32 ? Precision::kTf32 : precision;
}

class BackendValidation {
 public:
  BackendValidation(const std::string& name, Backend& backend, const ModelSource& model,
                    const std::vector<at::Tensor>& inputs, const OutputWeights& weights,
                    const std::shared_future<Reference>& reference, Precision precision, ValidationReport& report)
      : name_(name), backend_(backend), device_(backend.device(0)), model_(model), inputs_(inputs), weights_(weights),
        reference_(reference), report_(report),
        tolerance_(spec_of(bound_for(precision, backend, device_))),
        dtype_(spec_of(precision).compute), storage_(spec_of(precision).storage) {}

  void run(const std::function<void(const std::string& step)>& progress) {
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
        record_run_failure(e);
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
          record_run_failure(e);
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

  // The model raised on this backend: a failed "run" check with the error's telling line.
  void record_run_failure(const std::exception& error) {
    record(CheckKind::kRun, "model", false, std::nullopt,
           "failed on " + device_.str() + ": " + error_summary(error.what()));
  }

  // noise_rms: for gradients, the root mean square of the model's largest reference gradient
  // (allowed_error_norm says what for); 0 for outputs.
  void compare_to_reference(CheckKind check, const std::string& subject, const at::Tensor& result,
                            const at::Tensor& reference, double noise_rms = 0) {
    if (result.sizes() != reference.sizes()) {
      std::ostringstream detail;
      detail << "shape " << result.sizes() << " but the reference's is " << reference.sizes();
      record(check, subject, false, std::nullopt, detail.str());
      return;
    }
    const Comparison comparison = compare(result, reference);
    const Bound& bound = check == CheckKind::kGradient ? tolerance_.gradient : tolerance_.output;
    const bool passed = within(comparison, bound, noise_rms);
    std::ostringstream detail;
    if (comparison.exact) {
      detail << c10::toString(reference.scalar_type()) << " values compared exactly: " << comparison.differing
             << " of " << comparison.elements << " differ";
      if (!passed) detail << " (largest difference " << comparison.metrics.max_abs_error << ")";
      record(check, subject, passed, comparison.metrics, detail.str());
      return;
    }
    const bool noise = !direction_is_checked(comparison, bound);
    detail << (passed ? "within " : "outside ") << tolerance_.name << " tolerance: error norm "
           << comparison.error_norm << " (allowed " << allowed_error_norm(comparison, bound, noise_rms) << " = atol "
           << bound.atol << " x sqrt(" << comparison.elements << ") + rtol " << bound.rtol << " x reference norm "
           << comparison.reference_norm;
    if (noise && noise_rms > 0 && std::isfinite(comparison.reference_norm)) {
      detail << " + rtol x sqrt(" << comparison.elements << ") x " << noise_rms
             << ", the model's largest gradient per element, for a reference that is rounding noise";
    }
    detail << "), relative L2 error " << comparison.metrics.rel_l2_error << ", cosine "
           << comparison.metrics.cosine_similarity;
    if (!std::isfinite(comparison.reference_norm)) {
      detail << " (not checked: the reference holds NaN or infinite values)";
    } else if (!noise) {
      detail << " (at least " << bound.min_cosine << ")";
    } else {
      detail << " (not checked: the reference is within the absolute tolerance, rounding noise)";
    }
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
    const double noise_rms = largest_gradient_rms(reference.result.gradients);
    for (const auto& [name, expected] : reference.result.gradients) {
      const auto it = got.find(name);
      if (it == got.end()) {
        record(CheckKind::kGradient, name, false, std::nullopt, "no gradient on " + device_.str() + "; the reference has one");
        continue;
      }
      compare_to_reference(CheckKind::kGradient, name, it->second, expected, noise_rms);
      got.erase(it);
    }
    for (const auto& [name, tensor] : got) {
      record(CheckKind::kGradient, name, false, std::nullopt, "a gradient on " + device_.str() + " but none in the reference");
    }
  }

  // The root mean square of the reference gradient that has the largest, over the finite ones: the
  // size per element of the values a backward pass sums, whose rounding leaves the noise that a
  // gradient that cancels to zero consists of.
  static double largest_gradient_rms(const std::vector<std::pair<std::string, at::Tensor>>& gradients) {
    double largest = 0;
    for (const auto& [name, gradient] : gradients) {
      if (gradient.numel() == 0) continue;
      const double rms = gradient.abs().to(at::kDouble).square().mean().sqrt().item<double>();
      if (std::isfinite(rms)) largest = std::max(largest, rms);
    }
    return largest;
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

}  // namespace

void validate_backend(const std::string& name, Backend& backend, const ModelSource& model,
                      const std::vector<at::Tensor>& inputs, const OutputWeights& weights,
                      const std::shared_future<Reference>& reference, Precision precision, ValidationReport& report,
                      const std::function<void(const std::string& step)>& progress) {
  BackendValidation(name, backend, model, inputs, weights, reference, precision, report).run(progress);
}

}  // namespace torchbridge::validation

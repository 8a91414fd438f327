// GradScaler: torch.amp.GradScaler's algorithm over the same ATen kernels. Bit-identity with torch
// depends on doing exactly its tensor operations (the reciprocal in float64 then rounded to
// float32, one fused unscale per device and dtype, found_inf sums, the fused scale update), so the
// sequence below follows torch/amp/grad_scaler.py step by step; the comments say where it must.
#include <torchbridge/amp/grad_scaler.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::amp {
namespace {

const char* const kNoScaleFix =
    "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.";

[[noreturn]] void assertion(const std::string& message) {
  throw GradScalerAssertion(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
}

// The scale is a float32 tensor: checked as float32 holds it. 1e-46 became 0 (gradients NaN after
// the inf/NaN check, parameters NaN), 1e39 infinity (torch's overflow error at the first scale()).
void check_scale_value(const char* what, double scale) {
  const bool in_float32 = scale <= std::numeric_limits<float>::max() && static_cast<float>(scale) > 0.0F;
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0 && in_float32, "GradScaler: ", what,
                    " must be a finite number > 0, got ", scale,
                    in_float32 || !(std::isfinite(scale) && scale > 0)
                        ? ""
                        : " (the scale is float32, which holds about 1.4e-45 to 3.4e+38)");
}
void check_growth_factor(double factor) {
  TORCH_CHECK_VALUE(std::isfinite(factor) && factor > 1.0, "GradScaler: growth_factor must be a finite number > 1.0, got ",
                    factor);
}
void check_backoff_factor(double factor) {
  TORCH_CHECK_VALUE(factor > 0.0 && factor < 1.0, "GradScaler: backoff_factor must be in (0, 1), got ", factor);
}
void check_growth_interval(int64_t interval) {
  TORCH_CHECK_VALUE(interval >= 1, "GradScaler: growth_interval must be an integer >= 1, got ", interval);
}
void check_growth_tracker(int64_t tracker) {
  TORCH_CHECK_VALUE(tracker >= 0 && tracker <= INT32_MAX, "GradScaler: _growth_tracker must be an integer in [0, ",
                    INT32_MAX, "], got ", tracker);
}

// A float32 0-dim tensor on `device`, as torch.full((), value, dtype=torch.float32, device=device).
at::Tensor float_scalar(double value, const c10::Device& device) {
  return at::full({}, value, at::TensorOptions().dtype(at::kFloat).device(device));
}

// Whether a copy of the scaler's state to `device` may be non_blocking, as torch's scaler makes all
// of them. Not to the CPU: its kernels read (or write) the copy at once, and a non_blocking copy
// from a device lands in pinned memory later, so a found-inf flag set by a CPU kernel was then
// overwritten with the copied 0 and a step with a NaN gradient was taken (found 2026-11-29 with
// one optimizer over CPU and emu parameters: 283 of 300 steps; torch's scaler shares the hazard).
bool copy_may_be_asynchronous(const c10::Device& device) { return !device.is_cpu(); }

// The copy per device torch's _MultiDeviceReplicator hands out (a copy even on the same device).
class PerDevice {
 public:
  explicit PerDevice(at::Tensor master) : master_(std::move(master)) {}
  at::Tensor& get(const c10::Device& device) {
    for (auto& [known, tensor] : copies_) {
      if (known == device) return tensor;
    }
    copies_.emplace_back(device, master_.to(device, copy_may_be_asynchronous(device), /*copy=*/true));
    return copies_.back().second;
  }
  std::vector<std::pair<c10::Device, at::Tensor>> take() { return std::move(copies_); }

 private:
  at::Tensor master_;
  std::vector<std::pair<c10::Device, at::Tensor>> copies_;
};

std::vector<at::Tensor> optimizer_gradients(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> gradients;
  for (auto& group : optimizer.param_groups()) {
    for (auto& parameter : group.params()) {
      if (parameter.grad().defined()) gradients.push_back(parameter.grad());
    }
  }
  return gradients;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : enabled_(options.enabled) {
  // Like torch, a disabled scaler does not check its other arguments; its getters still report
  // them (they read 0, an impossible growth factor, before).
  init_scale_ = options.init_scale;
  growth_factor_ = options.growth_factor;
  backoff_factor_ = options.backoff_factor;
  growth_interval_ = options.growth_interval;
  if (!enabled_) return;
  check_scale_value("init_scale", options.init_scale);
  check_growth_factor(options.growth_factor);
  check_backoff_factor(options.backoff_factor);
  check_growth_interval(options.growth_interval);
}

void GradScaler::check_scale_initialized(const char* caller) const {
  if (!scale_.defined()) assertion(std::string("Attempted ") + caller + " but _scale is None.  " + kNoScaleFix);
  if (!growth_tracker_.defined()) {
    assertion(std::string("Attempted ") + caller + " but _growth_tracker is None.  " + kNoScaleFix);
  }
}

void GradScaler::lazy_init(const c10::Device& device) {
  scale_ = float_scalar(init_scale_, device);
  growth_tracker_ = at::full({}, init_growth_tracker_, at::TensorOptions().dtype(at::kInt).device(device));
}

void GradScaler::adopt_state_tensors(const at::Tensor& scale, const at::Tensor& growth_tracker) {
  TORCH_CHECK_VALUE(scale.dim() == 0 && scale.scalar_type() == at::kFloat, "GradScaler: the scale tensor must be a "
                    "0-dim float32 tensor, got ", scale.scalar_type(), " with ", scale.dim(), " dims");
  TORCH_CHECK_VALUE(growth_tracker.dim() == 0 && growth_tracker.scalar_type() == at::kInt, "GradScaler: the growth "
                    "tracker must be a 0-dim int32 tensor, got ", growth_tracker.scalar_type(), " with ",
                    growth_tracker.dim(), " dims");
  TORCH_CHECK_VALUE(scale.device() == growth_tracker.device(), "GradScaler: the scale (", scale.device(),
                    ") and growth tracker (", growth_tracker.device(), ") must be on one device");
  TORCH_CHECK(!scale_.defined(), "GradScaler: the scale tensor exists already");
  scale.fill_(init_scale_);
  growth_tracker.fill_(init_growth_tracker_);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!enabled_) return outputs;
  if (!scale_.defined()) lazy_init(outputs.device());
  return outputs.mul(scale_.to(outputs.device(), copy_may_be_asynchronous(outputs.device())));
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  if (!enabled_) return outputs;
  std::vector<at::Tensor> scaled;
  scaled.reserve(outputs.size());
  std::optional<PerDevice> per_device;  // one copy per device for the whole list, as torch
  for (const auto& output : outputs) {
    if (!per_device) {
      if (!scale_.defined()) lazy_init(output.device());
      per_device.emplace(scale_);
    }
    scaled.push_back(output.mul(per_device->get(output.device())));
  }
  return scaled;
}

GradScaler::OptimizerState& GradScaler::state_of(const void* optimizer) {
  for (auto& [key, state] : optimizer_states_) {
    if (key == optimizer) return state;
  }
  optimizer_states_.emplace_back(optimizer, OptimizerState{});
  return optimizer_states_.back().second;
}

void GradScaler::unscale_gradients(OptimizerState& state, const std::vector<at::Tensor>& gradients) {
  // The reciprocal in float64 rounded to float32, as torch computes it; on MPS, which has no
  // float64, in float32 (torch's own choice there; the float64 cast raised).
  const at::Tensor inv_scale = scale_.device().type() == c10::DeviceType::MPS
                                   ? scale_.reciprocal()
                                   : scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  const at::Tensor found_inf = float_scalar(0.0, scale_.device());
  PerDevice per_device_inv_scale(inv_scale), per_device_found_inf(found_inf);
  // Grouped by device, then dtype, in first-seen order: one fused kernel call per group.
  std::vector<std::pair<c10::Device, std::vector<std::pair<c10::ScalarType, std::vector<at::Tensor>>>>> groups;
  {
    at::NoGradGuard no_grad;
    for (const auto& gradient : gradients) {
      TORCH_CHECK_VALUE(gradient.scalar_type() != at::kHalf, "Attempting to unscale FP16 gradients.");
      const at::Tensor to_unscale = gradient.is_sparse() ? gradient._values() : gradient;
      auto device_it = groups.begin();
      while (device_it != groups.end() && device_it->first != to_unscale.device()) ++device_it;
      if (device_it == groups.end()) device_it = groups.insert(groups.end(), {to_unscale.device(), {}});
      auto& by_dtype = device_it->second;
      auto dtype_it = by_dtype.begin();
      while (dtype_it != by_dtype.end() && dtype_it->first != to_unscale.scalar_type()) ++dtype_it;
      if (dtype_it == by_dtype.end()) dtype_it = by_dtype.insert(by_dtype.end(), {to_unscale.scalar_type(), {}});
      dtype_it->second.push_back(to_unscale);
    }
    for (const auto& [device, by_dtype] : groups) {
      for (const auto& [dtype, tensors] : by_dtype) {
        at::_amp_foreach_non_finite_check_and_unscale_(tensors, per_device_found_inf.get(device),
                                                      per_device_inv_scale.get(device));
      }
    }
  }
  state.found_inf_per_device = per_device_found_inf.take();
}

void GradScaler::unscale_(const void* optimizer, const Gradients& gradients) {
  if (!enabled_) return;
  check_scale_initialized("unscale_");
  OptimizerState& state = state_of(optimizer);
  TORCH_CHECK(state.stage != Stage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update().");
  TORCH_CHECK(state.stage != Stage::kStepped, "unscale_() is being called after step().");
  unscale_gradients(state, gradients());
  state.stage = Stage::kUnscaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  unscale_(&optimizer, [&optimizer] { return optimizer_gradients(optimizer); });
}

bool GradScaler::any_inf(const OptimizerState& state) const {
  // torch sums the per-device flags on the host (one sync per device); any nonzero skips.
  double total = 0;
  for (const auto& [device, found_inf] : state.found_inf_per_device) total += found_inf.item<double>();
  return total != 0;
}

bool GradScaler::prepare_step(const void* optimizer, const Gradients& gradients) {
  check_scale_initialized("step");
  OptimizerState& state = state_of(optimizer);
  TORCH_CHECK(state.stage != Stage::kStepped, "step() has already been called since the last update().");
  if (state.stage == Stage::kReady) unscale_(optimizer, gradients);
  OptimizerState& unscaled = state_of(optimizer);
  if (unscaled.found_inf_per_device.empty()) assertion("No inf checks were recorded for this optimizer.");
  return !any_inf(unscaled);
}

void GradScaler::finish_step(const void* optimizer) { state_of(optimizer).stage = Stage::kStepped; }

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  const bool stepping = prepare_step(&optimizer, [&optimizer] { return optimizer_gradients(optimizer); });
  if (stepping) optimizer.step();
  finish_step(&optimizer);
  return stepping;
}

void GradScaler::update() {
  if (!enabled_) return;
  check_scale_initialized("update");
  std::vector<at::Tensor> found_infs;
  for (const auto& [key, state] : optimizer_states_) {
    for (const auto& [device, found_inf] : state.found_inf_per_device) {
      found_infs.push_back(found_inf.to(scale_.device(), copy_may_be_asynchronous(scale_.device())));
    }
  }
  if (found_infs.empty()) assertion("No inf checks were recorded prior to update.");
  at::Tensor combined = found_infs[0];
  for (size_t i = 1; i < found_infs.size(); ++i) combined += found_infs[i];
  at::_amp_update_scale_(scale_, growth_tracker_, combined, growth_factor_, backoff_factor_, growth_interval_);
  optimizer_states_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled_) return;
  check_scale_initialized("update");
  check_scale_value("new_scale", new_scale);
  scale_.fill_(new_scale);
  optimizer_states_.clear();
}

void GradScaler::update(const at::Tensor& new_scale) {
  if (!enabled_) return;
  check_scale_initialized("update");
  const char* const reason = "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                             "torch.FloatTensor with requires_grad=False.";
  if (new_scale.device().type() != scale_.device().type() || new_scale.numel() != 1 || new_scale.requires_grad()) {
    assertion(reason);
  }
  scale_.copy_(new_scale);
  optimizer_states_.clear();
}

double GradScaler::get_scale() const {
  if (!enabled_) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : init_scale_;
}

int64_t GradScaler::growth_tracker() const {
  if (!enabled_) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : init_growth_tracker_;
}

void GradScaler::set_growth_factor(double factor) {
  check_growth_factor(factor);
  growth_factor_ = factor;
}

void GradScaler::set_backoff_factor(double factor) {
  check_backoff_factor(factor);
  backoff_factor_ = factor;
}

void GradScaler::set_growth_interval(int64_t interval) {
  check_growth_interval(interval);
  growth_interval_ = interval;
}

std::optional<GradScalerState> GradScaler::state_dict() const {
  if (!enabled_) return std::nullopt;
  return GradScalerState{get_scale(), growth_factor_, backoff_factor_, growth_interval_, growth_tracker()};
}

void GradScaler::load_state_dict(const std::optional<GradScalerState>& state) {
  if (!enabled_) return;
  TORCH_CHECK(state.has_value(),
              "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.");
  // Every value is checked before any is applied, so a bad state leaves the scaler as it was.
  check_scale_value("scale", state->scale);
  check_growth_factor(state->growth_factor);
  check_backoff_factor(state->backoff_factor);
  check_growth_interval(state->growth_interval);
  check_growth_tracker(state->growth_tracker);
  init_scale_ = state->scale;
  if (scale_.defined()) scale_.fill_(state->scale);
  growth_factor_ = state->growth_factor;
  backoff_factor_ = state->backoff_factor;
  growth_interval_ = state->growth_interval;
  init_growth_tracker_ = state->growth_tracker;
  if (growth_tracker_.defined()) growth_tracker_.fill_(state->growth_tracker);
}

}  // namespace torchbridge::amp

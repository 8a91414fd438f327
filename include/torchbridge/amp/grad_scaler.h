#pragma once
// Dynamic loss scaling for C++ training loops: torch.amp.GradScaler's algorithm, which LibTorch
// lacks (pytorch#44710). Same defaults, same order of checks and messages, and the same fused
// kernels (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_), so a run scaled here
// and one scaled by torch.amp.GradScaler produce bit-identical scales and parameters.
//
//   GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);  // unscales, skips the step when a gradient is inf/NaN
//   scaler.update();         // backs off after a skip, grows after growth_interval clean steps

#include <torchbridge/amp/grad_scaler_state.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace torchbridge::amp {

// Raised where torch.amp.GradScaler raises AssertionError (the Python binding raises that): the
// scaler used before scale(), update() with no step recorded, a malformed update(new_scale).
class GradScalerAssertion : public c10::Error {
 public:
  using c10::Error::Error;
};

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

// Where torch accepts nonsense silently (a zero, negative or non-finite scale, growth_interval <=
// 0, backoff_factor <= 0) or asserts (growth_factor <= 1, backoff_factor >= 1), construction and
// the setters raise c10::ValueError naming the value and the valid range. Misuse in the training
// loop (unscale_ twice, step twice, update before any step) raises the c10::Error torch raises,
// with torch's wording.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // outputs * scale. The scale tensor is created on the device of the first tensor scaled; other
  // devices get a copy per call. Disabled: returns outputs unchanged.
  at::Tensor scale(const at::Tensor& outputs);
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  // Divides the optimizer's gradients by the scale in place and records, per device, whether any
  // was inf/NaN. At most once per optimizer between updates.
  void unscale_(torch::optim::Optimizer& optimizer);
  // Unscales (unless unscale_ was called) and runs optimizer.step() unless a gradient was inf/NaN.
  // Returns whether the optimizer stepped (torch returns the step's result or None instead).
  bool step(torch::optim::Optimizer& optimizer);
  // Backs the scale off if any optimizer skipped its step since the last update, else counts a
  // clean step and grows the scale after growth_interval of them.
  void update();
  // Sets the scale to `new_scale` instead (as torch's update(new_scale)).
  void update(double new_scale);
  // The same from a one-element tensor on this scaler's device type that does not require grad.
  void update(const at::Tensor& new_scale);

  double get_scale() const;  // 1.0 when disabled; init_scale before the first scale()
  double get_growth_factor() const { return growth_factor_; }
  void set_growth_factor(double factor);
  double get_backoff_factor() const { return backoff_factor_; }
  void set_backoff_factor(double factor);
  int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_interval(int64_t interval);
  int64_t growth_tracker() const;  // consecutive unskipped steps since the last growth or backoff
  bool is_enabled() const { return enabled_; }

  // Empty when disabled (torch returns {}). load_state_dict is a no-op when disabled and raises
  // torch's error for an empty state (one saved by a disabled scaler).
  std::optional<GradScalerState> state_dict() const;
  void load_state_dict(const std::optional<GradScalerState>& state);

  // ---- Optimizers that are not torch::optim::Optimizer (the Python binding) ----
  // The optimizer is an opaque key; its gradients are listed by the caller, in parameter order.
  // `gradients` returns the defined gradients only (the parameters that have one).
  using Gradients = std::function<std::vector<at::Tensor>()>;
  void unscale_(const void* optimizer, const Gradients& gradients);
  // The checks and unscaling of step(); returns whether the caller must run the optimizer's step.
  // The caller then calls finish_step(optimizer), whether or not it stepped.
  bool prepare_step(const void* optimizer, const Gradients& gradients);
  void finish_step(const void* optimizer);
  // Makes `scale` (float32, 0-dim) and `growth_tracker` (int32, 0-dim), tensors the caller
  // allocated on one device, this scaler's state, filled with the initial values: the Python
  // binding owns tensors Python can see and lets this object update them in place.
  void adopt_state_tensors(const at::Tensor& scale, const at::Tensor& growth_tracker);
  bool has_scale_tensor() const { return scale_.defined(); }
  // Whether an optimizer was unscaled or stepped since the last update(): the scaler is mid-step.
  bool step_in_progress() const { return !optimizer_states_.empty(); }

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;  // in first-seen order
  };

  void check_scale_initialized(const char* caller) const;
  void lazy_init(const c10::Device& device);
  OptimizerState& state_of(const void* optimizer);
  void unscale_gradients(OptimizerState& state, const std::vector<at::Tensor>& gradients);
  bool any_inf(const OptimizerState& state) const;

  bool enabled_;
  double init_scale_ = 0;
  double growth_factor_ = 0;
  double backoff_factor_ = 0;
  int64_t growth_interval_ = 0;
  int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;           // float32, 0-dim, undefined until the first scale()
  at::Tensor growth_tracker_;  // int32, 0-dim
  std::vector<std::pair<const void*, OptimizerState>> optimizer_states_;  // in first-use order
};

}  // namespace torchbridge::amp

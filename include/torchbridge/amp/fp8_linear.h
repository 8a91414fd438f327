#pragma once
// A Linear layer that computes its three matmuls in FP8 (amp/fp8.h), for training and inference:
//   forward      y      = x @ W^T + b    x, W quantized e4m3
//   backward     dx     = dy @ W          dy quantized e5m2, W e4m3 (the forward's copy)
//                dW     = dy^T @ x        dy e5m2, x e4m3 (the forward's copy)
//                db     = sum(dy)         in the gradient's own precision
// Each of x, W and dy has its own delayed-scaling state (an amax history and a scale), held as
// buffers so it moves with the module, and is saved and loaded with it. Parameters stay in their
// dtype (float32 master weights); the output has the input's dtype, or the autocast dtype when an
// autocast scope is active for the input's device.
//
//   torchbridge::amp::Fp8Linear layer(torchbridge::amp::Fp8LinearOptions(768, 3072));
//   auto y = layer(x);  // torch._scaled_mm on H100, the same numerics emulated on CPU/emu
//
// To switch an existing model's torch::nn::Linear layers to FP8, see amp/fp8_conversion.h.

#include <torchbridge/amp/fp8.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <ostream>

namespace torchbridge::amp {

struct Fp8LinearOptions {
  // Parameter names of their own: consumers building with -Wshadow -Werror refused the members' names.
  Fp8LinearOptions(int64_t in, int64_t out) : in_features(in), out_features(out) {}

  int64_t in_features;
  int64_t out_features;
  bool bias = true;
  DelayedScalingOptions scaling;
  Fp8MatmulKernel kernel = Fp8MatmulKernel::kAuto;

  // Raises c10::ValueError naming the bad value: features must be >= 1, scaling valid.
  void validate() const;
};

class Fp8LinearImpl : public torch::nn::Cloneable<Fp8LinearImpl> {
 public:
  explicit Fp8LinearImpl(const Fp8LinearOptions& options);
  // Takes over `linear`'s parameters (the same tensors, so an optimizer built over them still
  // updates this layer) with fresh scaling states on the parameters' device.
  Fp8LinearImpl(const torch::nn::LinearImpl& linear, const DelayedScalingOptions& scaling,
                Fp8MatmulKernel kernel = Fp8MatmulKernel::kAuto);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  // input [..., in_features] -> [..., out_features]
  at::Tensor forward(const at::Tensor& input);

  Fp8LinearOptions options;
  at::Tensor weight;  // [out_features, in_features]
  at::Tensor bias;    // [out_features], undefined without bias
  Fp8ScalingState input_scaling;
  Fp8ScalingState weight_scaling;
  Fp8ScalingState grad_output_scaling;

 private:
  void register_scaling_buffers();
};

TORCH_MODULE(Fp8Linear);

}  // namespace torchbridge::amp

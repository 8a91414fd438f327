// Fp8Linear (include/torchbridge/amp/fp8_linear.h): the layer and its autograd function.
#include <torchbridge/amp/fp8_linear.h>

#include <ATen/autocast_mode.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

namespace torchbridge::amp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The scaling state tensors travel through the autograd function as tensor arguments (they never
// require grad), because AutogradContext can keep tensors but not pointers to a module.
struct Fp8LinearFunction : torch::autograd::Function<Fp8LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor input_history, at::Tensor input_scale,
                            at::Tensor weight_history, at::Tensor weight_scale, at::Tensor grad_history,
                            at::Tensor grad_scale, int64_t history_length, int64_t margin, int64_t kernel,
                            int64_t out_dtype) {
    const DelayedScalingOptions scaling{history_length, margin};
    Fp8ScalingState input_state{input_history, input_scale}, weight_state{weight_history, weight_scale};
    const int64_t in_features = weight.size(1), out_features = weight.size(0);
    const Fp8Tensor x = quantize_delayed(input.reshape({-1, in_features}), Fp8Format::kE4M3, scaling, input_state);
    const Fp8Tensor w = quantize_delayed(weight, Fp8Format::kE4M3, scaling, weight_state);
    const auto dtype = static_cast<c10::ScalarType>(out_dtype);
    at::Tensor output = fp8_matmul(x.data, x.scale_inverse, w.data.t(), w.scale_inverse, dtype,
                                   static_cast<Fp8MatmulKernel>(kernel));
    if (bias.defined()) output.add_(bias.to(dtype));

    ctx->save_for_backward({x.data, x.scale_inverse, w.data, w.scale_inverse, grad_history, grad_scale});
    ctx->saved_data["input_sizes"] = input.sizes().vec();
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : weight.scalar_type());
    ctx->saved_data["history_length"] = history_length;
    ctx->saved_data["margin"] = margin;
    ctx->saved_data["kernel"] = kernel;

    std::vector<int64_t> output_sizes = input.sizes().vec();
    output_sizes.back() = out_features;
    return output.reshape(output_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& x_inverse = saved[1];
    const at::Tensor& w = saved[2];
    const at::Tensor& w_inverse = saved[3];
    Fp8ScalingState grad_state{saved[4], saved[5]};
    const DelayedScalingOptions scaling{ctx->saved_data["history_length"].toInt(), ctx->saved_data["margin"].toInt()};
    const auto kernel = static_cast<Fp8MatmulKernel>(ctx->saved_data["kernel"].toInt());
    const auto input_dtype = static_cast<c10::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    const auto weight_dtype = static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const std::vector<int64_t> input_sizes = ctx->saved_data["input_sizes"].toIntVector();

    const at::Tensor grad_2d = grad_outputs[0].reshape({-1, w.size(0)});
    const Fp8Tensor g = quantize_delayed(grad_2d, Fp8Format::kE5M2, scaling, grad_state);
    at::Tensor grad_input = fp8_matmul(g.data, g.scale_inverse, w, w_inverse, input_dtype, kernel).reshape(input_sizes);
    at::Tensor grad_weight = fp8_matmul(g.data.t(), g.scale_inverse, x, x_inverse, weight_dtype, kernel);
    at::Tensor grad_bias;
    if (ctx->saved_data["has_bias"].toBool()) {
      const auto bias_dtype = static_cast<c10::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
      // Summed in float32 straight from the gradient's dtype (no widened copy of it first).
      grad_bias = grad_2d.sum(0, /*keepdim=*/false, at::kFloat).to(bias_dtype);
    }
    // One gradient per forward argument; the state tensors and options get none.
    return {grad_input, grad_weight, grad_bias, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

}  // namespace

void Fp8LinearOptions::validate() const {
  TORCH_CHECK_VALUE(in_features >= 1 && out_features >= 1,
                    "Fp8Linear: in_features and out_features must be at least 1, got ", in_features, " and ",
                    out_features);
  scaling.validate();
}

Fp8LinearImpl::Fp8LinearImpl(const Fp8LinearOptions& options_) : options(options_) {
  options.validate();
  reset();
}

Fp8LinearImpl::Fp8LinearImpl(const torch::nn::LinearImpl& linear, const DelayedScalingOptions& scaling,
                             Fp8MatmulKernel kernel)
    : options(linear.options.in_features(), linear.options.out_features()) {
  options.bias = linear.options.bias();
  options.scaling = scaling;
  options.kernel = kernel;
  options.validate();
  weight = register_parameter("weight", linear.weight);
  if (options.bias) bias = register_parameter("bias", linear.bias);
  register_scaling_buffers();
}

void Fp8LinearImpl::reset() {
  // torch::nn::Linear's initialisation, so swapping one for the other changes no statistics.
  weight = register_parameter("weight", at::empty({options.out_features, options.in_features}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (options.bias) {
    bias = register_parameter("bias", at::empty({options.out_features}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features));
    torch::nn::init::uniform_(bias, -bound, bound);
  } else {
    bias = at::Tensor();
  }
  register_scaling_buffers();
}

void Fp8LinearImpl::register_scaling_buffers() {
  const c10::Device device = weight.device();
  const int64_t length = options.scaling.amax_history_length;
  input_scaling = Fp8ScalingState::create(length, device);
  weight_scaling = Fp8ScalingState::create(length, device);
  grad_output_scaling = Fp8ScalingState::create(length, device);
  input_scaling.amax_history = register_buffer("input_amax_history", input_scaling.amax_history);
  input_scaling.scale = register_buffer("input_scale", input_scaling.scale);
  weight_scaling.amax_history = register_buffer("weight_amax_history", weight_scaling.amax_history);
  weight_scaling.scale = register_buffer("weight_scale", weight_scaling.scale);
  grad_output_scaling.amax_history = register_buffer("grad_output_amax_history", grad_output_scaling.amax_history);
  grad_output_scaling.scale = register_buffer("grad_output_scale", grad_output_scaling.scale);
}

void Fp8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "torchbridge::amp::Fp8Linear(in_features=" << options.in_features
         << ", out_features=" << options.out_features << ", bias=" << (options.bias ? "true" : "false")
         << ", amax_history_length=" << options.scaling.amax_history_length << ", margin=" << options.scaling.margin
         << ", kernel=" << to_string(options.kernel) << ")";
}

at::Tensor Fp8LinearImpl::forward(const at::Tensor& input) {
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(-1) == options.in_features,
                    "Fp8Linear: the input's last dimension must be in_features = ", options.in_features,
                    ", got input of shape ", input.sizes());
  TORCH_CHECK_VALUE(input.device() == weight.device(), "Fp8Linear: the input is on ", input.device(),
                    " but the layer is on ", weight.device(), "; move one of them");
  const c10::DeviceType device_type = input.device().type();
  const c10::ScalarType out_dtype =
      at::autocast::is_autocast_enabled(device_type) ? at::autocast::get_autocast_dtype(device_type)
                                                      : input.scalar_type();
  const Fp8MatmulKernel kernel = resolve_fp8_matmul_kernel(options.kernel, input.device());
  return Fp8LinearFunction::apply(
      input, weight, bias, input_scaling.amax_history, input_scaling.scale, weight_scaling.amax_history,
      weight_scaling.scale, grad_output_scaling.amax_history, grad_output_scaling.scale,
      options.scaling.amax_history_length, options.scaling.margin,
      static_cast<int64_t>(kernel), static_cast<int64_t>(out_dtype));
}

}  // namespace torchbridge::amp

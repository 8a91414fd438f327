#pragma once
// The steps every C++ model kind shares around its own forward call.

#include <torchbridge/validation/validator.h>

namespace torchbridge::validation {

// `inputs` on `device`; floating-point ones cast to `dtype`, others (indices, masks) kept.
std::vector<at::Tensor> place_inputs(const std::vector<at::Tensor>& inputs, c10::Device device,
                                     c10::ScalarType dtype);
// sum_i sum(outputs[i] * weights[i]), the weights moved beside each output. Raises when the
// counts or shapes differ (the model's outputs changed between runs).
at::Tensor weighted_loss(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& weights);
std::vector<at::Tensor> detached_cpu(const std::vector<at::Tensor>& tensors);
// Forward, then (with weights) backward, with gradients cleared first; `parameters` are named.
RunResult run_model(const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& forward,
                    const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                    const std::vector<at::Tensor>& placed_inputs, const std::vector<at::Tensor>& weights);

}  // namespace torchbridge::validation

#pragma once
// The steps every C++ model kind shares around its own forward call.

#include <torchbridge/validation/validator.h>

#include <torchbridge/module_state.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace torchbridge::validation {

// `inputs` on `device`; floating-point ones cast to `dtype`, others (indices, masks) kept.
std::vector<at::Tensor> place_inputs(const std::vector<at::Tensor>& inputs, c10::Device device,
                                     c10::ScalarType dtype);
// sum_i sum(outputs[i] * weights[i]), the weights moved beside each output. Raises when the
// counts or shapes differ (the model's outputs changed between runs).
at::Tensor weighted_loss(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& weights);
std::vector<at::Tensor> detached_cpu(const std::vector<at::Tensor>& tensors);
// Forward, then (with weights) backward, with gradients cleared first. `state` is the module's
// module_state(): gradients are collected from the tensors that require them (the parameters).
// With `checkpointed`, the forward pass with weights runs as one checkpointed region.
RunResult run_model(const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& forward,
                    const NamedTensors& state,
                    const std::vector<at::Tensor>& placed_inputs, const OutputWeights& weights,
                    bool checkpointed = false);

// `state` written as a TorchBridge portable checkpoint (safetensors, through the checkpoint
// module's writer) and read back onto `device` by its reader: the round trip a model's weights
// take between runs and machines. Tensors sharing storage (tied weights) are written once and
// read back under each of their names.
std::map<std::string, at::Tensor> checkpoint_round_trip(const NamedTensors& state, c10::Device device);
// Replaces the data of every tensor in `state` with `values[name]` (names must all be present).
void assign(const NamedTensors& state, const std::map<std::string, at::Tensor>& values);

}  // namespace torchbridge::validation

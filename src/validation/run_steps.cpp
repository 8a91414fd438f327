#include "validation/run_steps.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace torchbridge::validation {

std::vector<at::Tensor> place_inputs(const std::vector<at::Tensor>& inputs, c10::Device device,
                                     c10::ScalarType dtype) {
  std::vector<at::Tensor> placed;
  for (const auto& input : inputs) {
    placed.push_back(at::isFloatingType(input.scalar_type()) ? input.to(device, dtype) : input.to(device));
  }
  return placed;
}

at::Tensor weighted_loss(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& weights) {
  TORCH_CHECK(outputs.size() == weights.size(), "the model returned ", outputs.size(), " outputs in this run but ",
              weights.size(), " in the reference run");
  at::Tensor loss;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!at::isFloatingType(outputs[i].scalar_type()) || !outputs[i].requires_grad()) continue;
    TORCH_CHECK(outputs[i].sizes() == weights[i].sizes(), "output ", i, " has shape ", outputs[i].sizes(),
                " in this run but ", weights[i].sizes(), " in the reference run");
    const at::Tensor term = (outputs[i] * weights[i].to(outputs[i].device(), outputs[i].scalar_type())).sum();
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

std::vector<at::Tensor> detached_cpu(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().cpu().clone());
  return out;
}

RunResult run_model(const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& forward,
                    const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                    const std::vector<at::Tensor>& placed_inputs, const std::vector<at::Tensor>& weights) {
  for (const auto& [name, p] : parameters) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  RunResult result;
  if (weights.empty()) {
    at::NoGradGuard no_grad;
    result.outputs = detached_cpu(forward(placed_inputs));
    return result;
  }
  const auto outputs = forward(placed_inputs);
  const at::Tensor loss = weighted_loss(outputs, weights);
  if (loss.defined()) loss.backward();
  result.outputs = detached_cpu(outputs);
  for (const auto& [name, p] : parameters) {
    if (p.requires_grad() && p.grad().defined()) result.gradients.emplace_back(name, p.grad().detach().cpu().clone());
  }
  for (const auto& [name, p] : parameters) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();  // gradients are device memory too
  }
  return result;
}

}  // namespace torchbridge::validation

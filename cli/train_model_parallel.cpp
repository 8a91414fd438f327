#include "train_model_parallel.h"

#include "portability_training.h"

#include <torchbridge/distributed/tensor_parallel.h>
#include <torchbridge/distributed/zero_optimizer.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

const std::vector<std::string> kLayers = {"fc1", "fc2", "fc3"};  // the built-in mlp's, in order

// A torch::nn copy of one of the TorchScript model's Linear layers (its own tensors, on the
// model's device).
torch::nn::Linear linear_copy(const torch::jit::Module& model, const std::string& name) {
  TORCH_CHECK_VALUE(model.hasattr(name), "tensor and pipeline parallel train the built-in mlp, whose layers are ",
                    "fc1, fc2, fc3; this model has no '", name, "'");
  const torch::jit::Module layer = model.attr(name).toModule();
  const at::Tensor weight = layer.attr("weight").toTensor(), bias = layer.attr("bias").toTensor();
  torch::nn::Linear copy(weight.size(1), weight.size(0));
  copy->to(weight.device());
  const at::NoGradGuard no_grad;
  copy->weight.copy_(weight);
  copy->bias.copy_(bias);
  return copy;
}

// Writes `weight` and `bias` into the TorchScript model's layer `name`.
void write_back(torch::jit::Module& model, const std::string& name, const at::Tensor& weight, const at::Tensor& bias) {
  const torch::jit::Module layer = model.attr(name).toModule();
  const at::NoGradGuard no_grad;
  layer.attr("weight").toTensor().copy_(weight);
  layer.attr("bias").toTensor().copy_(bias);
}

std::vector<at::Tensor> parameters_of(const torch::nn::Module& module) { return module.parameters(); }

}  // namespace

ModelParallelRun train_mlp_tensor_parallel(torch::jit::Module& model, const std::shared_ptr<distributed::ProcessGroup>& group,
                                           int64_t steps, const BatchForStep& batch) {
  const torch::nn::Linear fc1 = linear_copy(model, "fc1"), fc2 = linear_copy(model, "fc2");
  torch::nn::Linear fc3 = linear_copy(model, "fc3");
  distributed::ColumnParallelLinear up(fc1, group, /*gather_output=*/false);
  distributed::RowParallelLinear down(fc2, group);
  std::vector<at::Tensor> trained = parameters_of(*up);
  for (const auto& p : down->parameters()) trained.push_back(p);
  for (const auto& p : fc3->parameters()) trained.push_back(p);
  auto optimizer = make_optimizer(trained);

  ModelParallelRun run;
  for (int64_t step = 0; step < steps; ++step) {
    const auto [inputs, targets] = batch(step);
    optimizer->zero_grad();
    const at::Tensor output = fc3->forward(at::relu(down->forward(at::relu(up->forward(inputs)))));
    const at::Tensor loss = at::mse_loss(output, targets);
    loss.backward();
    optimizer->step();
    const double value = loss.item<double>();
    if (step == 0) run.first_loss = value;
    run.last_loss = value;
  }
  run.optimizer_state_bytes = distributed::optimizer_state_bytes(*optimizer);
  // The whole layers again, on every rank: fc1's rows and fc2's columns gathered in rank order.
  // (Collectives take CPU tensors: an SDK device's travel through host memory.)
  write_back(model, "fc1", at::cat(group->all_gather(up->weight.detach().cpu()), 0),
             at::cat(group->all_gather(up->bias.detach().cpu()), 0));
  write_back(model, "fc2", at::cat(group->all_gather(down->weight.detach().cpu()), 1), down->bias.detach());
  write_back(model, "fc3", fc3->weight.detach(), fc3->bias.detach());
  return run;
}

ModelParallelRun train_mlp_pipeline_parallel(torch::jit::Module& model,
                                             const std::shared_ptr<distributed::ProcessGroup>& group, int64_t steps,
                                             const BatchForStep& batch, int64_t micro_batches,
                                             distributed::PipelineSchedule schedule) {
  const int stages = group->world_size(), stage = group->rank();
  const auto layer_count = static_cast<int>(kLayers.size());
  TORCH_CHECK_VALUE(stages <= layer_count, "--pipeline-parallel ", stages, ": the built-in mlp has ", layer_count,
                    " layers, so at most ", layer_count, " stages");
  // Layers to stages as evenly as they go, the earlier stages taking the remainder.
  std::vector<int> owner;
  for (int s = 0; s < stages; ++s) {
    const int count = layer_count / stages + (s < layer_count % stages ? 1 : 0);
    owner.insert(owner.end(), count, s);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Sequential mine;
  for (int i = 0; i < layer_count; ++i) {
    layers.push_back(linear_copy(model, kLayers[static_cast<size_t>(i)]));
    if (owner[static_cast<size_t>(i)] != stage) continue;
    mine->push_back(layers.back());
    if (i + 1 < layer_count) mine->push_back(torch::nn::ReLU());
  }
  auto optimizer = make_optimizer(parameters_of(*mine));
  const c10::Device device = layers.front()->weight.device();
  distributed::Pipeline pipeline([&mine](const at::Tensor& x) { return mine->forward(x); }, group, schedule, device);

  ModelParallelRun run;
  for (int64_t step = 0; step < steps; ++step) {
    const auto [inputs, targets] = batch(step);
    optimizer->zero_grad();
    const double value = pipeline.train_step(inputs, targets, micro_batches, [](const at::Tensor& y, const at::Tensor& t) {
      return at::mse_loss(y, t);
    });
    optimizer->step();
    if (step == 0) run.first_loss = value;
    run.last_loss = value;
  }
  run.optimizer_state_bytes = distributed::optimizer_state_bytes(*optimizer);
  // Every layer from the stage that trained it, into every rank's whole model.
  for (int i = 0; i < layer_count; ++i) {
    at::Tensor weight = layers[static_cast<size_t>(i)]->weight.detach().cpu();
    at::Tensor bias = layers[static_cast<size_t>(i)]->bias.detach().cpu();
    group->broadcast(weight, owner[static_cast<size_t>(i)]);
    group->broadcast(bias, owner[static_cast<size_t>(i)]);
    write_back(model, kLayers[static_cast<size_t>(i)], weight, bias);
  }
  return run;
}

}  // namespace torchbridge::cli

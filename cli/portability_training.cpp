#include "portability_training.h"

#include <torchbridge/memory/activation_checkpoint.h>
#include <torchbridge/validation/builtin_models.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>
#include <vector>

namespace torchbridge::cli {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<at::Tensor> parameters) {
  return std::make_unique<torch::optim::Adam>(std::move(parameters), torch::optim::AdamOptions(3e-3));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const torch::jit::Module& model) {
  std::vector<at::Tensor> parameters;
  for (const auto& p : model.parameters()) parameters.push_back(p);
  return make_optimizer(std::move(parameters));
}

TrainingRun train_transformer(c10::Device device, int steps, uint64_t seed, bool checkpointing) {
  // A copy, not a reference: GCC 13's -Wdangling-reference cannot see that the returned entry
  // outlives the temporary std::string the name is passed as.
  const validation::BuiltinModel info = validation::builtin_model_info("transformer");
  TrainingRun run;
  run.model = validation::make_builtin_model("transformer", seed);
  run.model.to(device);
  run.model.train();
  torch::jit::Module teacher = validation::make_builtin_model("transformer", seed + 1000);
  teacher.to(device);
  run.optimizer = make_optimizer(run.model);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<double> losses;
  // As the validator runs TorchScript: the profiling optimiser's specialised graphs bring nothing
  // to a model this small and cost tens of milliseconds per step on a busy 2-core machine.
  torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    // Inputs come from a CPU generator so every backend would see the same data.
    const at::Tensor x = at::randn(info.input_shape, generator, at::TensorOptions()).to(device);
    at::Tensor target;
    {
      at::NoGradGuard no_grad;
      target = teacher.forward({x}).toTensor();
    }
    run.optimizer->zero_grad();
    const auto forward = [&run](const at::Tensor& input) { return run.model.forward({input}).toTensor(); };
    const at::Tensor output = checkpointing ? memory::checkpoint(forward, x) : forward(x);
    const at::Tensor loss = at::mse_loss(output, target);
    loss.backward();
    run.optimizer->step();
    losses.push_back(loss.item<double>());
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.steps = steps;
  const size_t window = std::min<size_t>(10, losses.size());
  run.first_loss = std::accumulate(losses.begin(), losses.begin() + window, 0.0) / window;
  run.last_loss = std::accumulate(losses.end() - window, losses.end(), 0.0) / window;
  run.model.eval();
  return run;
}

}  // namespace torchbridge::cli

// The C++ side of the Python training-state interchange test (tests/python/test_training_state.py):
// the same run as training_state_test.cpp (Linear(6,8)-Tanh-Linear(8,2), batch from seed 99),
// saved or resumed through save_training_state / load_training_state.
//   training_state_interop save   STATE OPTIMIZER STEPS [--scaler]      train a fresh model, save the state
//   training_state_interop resume STATE OPTIMIZER STEPS OUT [--scaler]  restore, train on, write the
//                                                                        parameters (and the scale) to OUT
//   training_state_interop rewrite IN OUT OPTIMIZER   restore IN and save it again as OUT, carrying the
//                                                     progress (GradScaler and LR scheduler states) through
// --scaler: loss scaling by torchbridge::amp::GradScaler (growth_interval 2, so the scale moves),
// saved in and restored from TrainingProgress::grad_scaler.
#include <torchbridge/amp/grad_scaler.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/checkpoint/training_state.h>

#include <ATen/ops/scalar_tensor.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace torchbridge::checkpoint;

// Hyper-parameters as the Python test builds its optimizers.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& type, torch::nn::Sequential& model) {
  if (type == "SGD") return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  if (type == "Adam") return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
  if (type == "AdamW") {
    return std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  }
  throw std::invalid_argument("unknown optimizer " + type);
}

torchbridge::amp::GradScalerOptions scaler_options() {
  torchbridge::amp::GradScalerOptions options;
  options.growth_interval = 2;
  return options;
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps,
           torchbridge::amp::GradScaler* scaler) {
  torch::manual_seed(99);
  const at::Tensor x = torch::randn({16, 6}), y = torch::randn({16, 2});
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    const at::Tensor loss = torch::mse_loss(model->forward(x), y);
    if (scaler == nullptr) {
      loss.backward();
      optimizer.step();
      continue;
    }
    scaler->scale(loss).backward();
    scaler->step(optimizer);
    scaler->update();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string mode = args.empty() ? "" : args[0];
  const bool with_scaler = !args.empty() && args.back() == "--scaler";
  const size_t positional = args.size() - (with_scaler ? 1 : 0);
  if (!((mode == "save" && positional == 4) || (mode == "resume" && positional == 5) ||
        (mode == "rewrite" && positional == 4 && !with_scaler))) {
    std::fprintf(stderr,
                 "usage: %s save STATE OPTIMIZER STEPS [--scaler] | resume STATE OPTIMIZER STEPS OUT [--scaler] | "
                 "rewrite IN OUT OPTIMIZER\n",
                 argv[0]);
    return 2;
  }
  try {
    torch::manual_seed(mode == "save" ? 1 : 7);  // a resumed model's own weights must all be replaced
    torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
    if (mode == "rewrite") {
      auto optimizer = make_optimizer(args[3], model);
      const TrainingProgress progress = load_training_state(args[1], *model, *optimizer);
      save_training_state(args[2], *model, *optimizer, progress);
      return 0;
    }
    auto optimizer = make_optimizer(args[2], model);
    const int steps = std::stoi(args[3]);
    std::optional<torchbridge::amp::GradScaler> scaler;
    if (with_scaler) scaler.emplace(scaler_options());
    if (mode == "save") {
      train(model, *optimizer, steps, scaler ? &*scaler : nullptr);
      TrainingProgress progress{steps, 1, {{"writer", "c++"}}};
      if (scaler) progress.grad_scaler = scaler->state_dict();
      save_training_state(args[1], *model, *optimizer, progress);
      return 0;
    }
    const TrainingProgress progress = load_training_state(args[1], *model, *optimizer);
    if (scaler) scaler->load_state_dict(progress.grad_scaler);
    train(model, *optimizer, steps, scaler ? &*scaler : nullptr);
    std::vector<std::pair<std::string, at::Tensor>> parameters;
    for (const auto& item : model->named_parameters()) parameters.emplace_back(item.key(), item.value().detach());
    if (scaler) parameters.emplace_back("scale", at::scalar_tensor(scaler->get_scale(), at::kDouble));
    save(args[4], parameters, {});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

// The C++ side of the Python training-state interchange test (tests/python/test_training_state.py):
// the same run as training_state_test.cpp (Linear(6,8)-Tanh-Linear(8,2), batch from seed 99),
// saved or resumed through save_training_state / load_training_state.
//   training_state_interop save   STATE OPTIMIZER STEPS      train a fresh model, save the state
//   training_state_interop resume STATE OPTIMIZER STEPS OUT  restore, train on, write the parameters to OUT
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/checkpoint/training_state.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <exception>
#include <memory>
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

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps) {
  torch::manual_seed(99);
  const at::Tensor x = torch::randn({16, 6}), y = torch::randn({16, 2});
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!((mode == "save" && argc == 5) || (mode == "resume" && argc == 6))) {
    std::fprintf(stderr, "usage: %s save STATE OPTIMIZER STEPS | resume STATE OPTIMIZER STEPS OUT\n", argv[0]);
    return 2;
  }
  try {
    torch::manual_seed(mode == "save" ? 1 : 7);  // a resumed model's own weights must all be replaced
    torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
    auto optimizer = make_optimizer(argv[3], model);
    const int steps = std::stoi(argv[4]);
    if (mode == "save") {
      train(model, *optimizer, steps);
      save_training_state(argv[2], *model, *optimizer, {steps, 1, {{"writer", "c++"}}});
      return 0;
    }
    load_training_state(argv[2], *model, *optimizer);
    train(model, *optimizer, steps);
    std::vector<std::pair<std::string, at::Tensor>> parameters;
    for (const auto& item : model->named_parameters()) parameters.emplace_back(item.key(), item.value().detach());
    save(argv[5], parameters, {});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

// Saving a training run on one backend and resuming it on another continues bit-identically to
// an uninterrupted run on the CPU: every parameter is compared after further steps.
#include <torchbridge/checkpoint/training_state.h>
#include <torchbridge/registry.h>

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "error_message.h"

#include <algorithm>
#include <functional>
#include <memory>

namespace torchbridge::checkpoint {
namespace {

using test_support::error_of;

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& type, torch::nn::Sequential& model) {
  if (type == "SGD") return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  if (type == "Adam") return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps, const c10::Device& device) {
  torch::manual_seed(99);
  const at::Tensor x = torch::randn({16, 6}).to(device), y = torch::randn({16, 2}).to(device);
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
}

struct Case {
  std::string optimizer;
  std::string save_on;
  std::string resume_on;
};

class TrainingState : public ::testing::TestWithParam<Case> {};

TEST_P(TrainingState, ResumesBitIdenticallyOnAnotherBackend) {
  const Case c = GetParam();
  const c10::Device save_device = create_backend(c.save_on)->device(0);
  const c10::Device resume_device = create_backend(c.resume_on)->device(0);
  const std::string path = ::testing::TempDir() + "state_" + c.optimizer + c.save_on + c.resume_on + ".safetensors";

  // Reference: 5 steps on the CPU, then 5 more, uninterrupted.
  auto reference = make_model(1);
  auto reference_optimizer = make_optimizer(c.optimizer, reference);
  train(reference, *reference_optimizer, 5, c10::Device(c10::kCPU));
  train(reference, *reference_optimizer, 5, c10::Device(c10::kCPU));

  // Interrupted: 5 steps on `save_on`, saved; a fresh model and optimizer restored on `resume_on`.
  auto first = make_model(1);
  first->to(save_device);
  auto first_optimizer = make_optimizer(c.optimizer, first);
  train(first, *first_optimizer, 5, save_device);
  save_training_state(path, *first, *first_optimizer, {5, 1, {{"run", "test"}}});

  auto resumed = make_model(7);  // different initial weights: everything must come from the file
  auto resumed_optimizer = make_optimizer(c.optimizer, resumed);
  RestoreOptions options;
  options.device_map = {{"", resume_device}};
  const TrainingProgress progress = load_training_state(path, *resumed, *resumed_optimizer, options);
  EXPECT_EQ(progress.step, 5);
  EXPECT_EQ(progress.epoch, 1);
  EXPECT_EQ(progress.user_metadata.at("run"), "test");
  for (const auto& p : resumed->parameters()) EXPECT_EQ(p.device(), resume_device);
  train(resumed, *resumed_optimizer, 5, resume_device);

  const auto expected = reference->named_parameters();
  for (const auto& item : resumed->named_parameters()) {
    const at::Tensor got = item.value().detach().cpu(), want = expected[item.key()].detach();
    EXPECT_TRUE(at::equal(got, want)) << item.key() << " differs after resuming (" << c.optimizer << ", "
                                      << c.save_on << " -> " << c.resume_on << "), max abs diff "
                                      << (got - want).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, TrainingState,
    ::testing::Values(Case{"SGD", "cpu", "emu"}, Case{"Adam", "cpu", "emu"}, Case{"AdamW", "cpu", "emu"},
                      Case{"SGD", "emu", "cpu"}, Case{"Adam", "emu", "cpu"}, Case{"AdamW", "emu", "cpu"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.optimizer + "_" + info.param.save_on + "_to_" + info.param.resume_on;
    });

TEST(TrainingStateErrors, MismatchesAreNamed) {
  const std::string path = ::testing::TempDir() + "state_errors.safetensors";
  auto model = make_model(1);
  auto sgd = make_optimizer("SGD", model);
  train(model, *sgd, 1, c10::Device(c10::kCPU));
  save_training_state(path, *model, *sgd, {});
  auto adam = make_optimizer("Adam", model);
  EXPECT_NE(error_of([&] { load_training_state(path, *model, *adam); }).find("holds a SGD optimizer but a Adam"),
            std::string::npos);
  // The second layer's shape differs; the first layer (checked earlier) must not be touched either.
  torch::nn::Sequential other(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  auto other_sgd = make_optimizer("SGD", other);
  const at::Tensor untouched = other->parameters()[0].detach().clone();
  EXPECT_NE(error_of([&] { load_training_state(path, *other, *other_sgd); }).find("was saved with shape"),
            std::string::npos);
  EXPECT_TRUE(at::equal(other->parameters()[0], untouched)) << "a failed restore partially loaded the model";
}

TEST(TrainingStateDevices, AutoSpreadsModulesOverDevicesByFreeMemory) {
  const auto emu = create_backend("emu");  // two devices with equal free memory
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                              torch::nn::Linear(64, 64));
  auto sgd = make_optimizer("SGD", model);
  const std::string path = ::testing::TempDir() + "state_auto.safetensors";
  save_training_state(path, *model, *sgd, {});
  torch::nn::Sequential restored(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                                 torch::nn::Linear(64, 64));
  auto restored_sgd = make_optimizer("SGD", restored);
  RestoreOptions options;
  options.auto_backend = "emu";
  load_training_state(path, *restored, *restored_sgd, options);
  const auto params = restored->named_parameters();
  EXPECT_EQ(params["0.weight"].device(), emu->device(0));
  EXPECT_EQ(params["1.weight"].device(), emu->device(0));
  EXPECT_EQ(params["2.weight"].device(), emu->device(1));
  EXPECT_EQ(params["3.bias"].device(), emu->device(1));
  EXPECT_TRUE(at::equal(params["3.weight"].cpu(), model->named_parameters()["3.weight"]));
}

struct Fp8Layer : torch::nn::Module {
  Fp8Layer() {
    weight = register_buffer("weight", torch::randn({4, 4}).to(at::kFloat8_e4m3fn));
    weight_scale = register_buffer("weight_scale", torch::full({1}, 0.25));
  }
  at::Tensor weight, weight_scale;
};

TEST(TrainingStateDtypes, Fp8WidensWithItsScaleWhereTheTargetLacksFp8) {
  const auto cpu = create_backend("cpu");
  const auto& dtypes = cpu->info(0).supported_dtypes;
  if (std::find(dtypes.begin(), dtypes.end(), at::kFloat8_e4m3fn) != dtypes.end()) GTEST_SKIP() << "the CPU holds fp8";
  const bool bf16 = std::find(dtypes.begin(), dtypes.end(), at::kBFloat16) != dtypes.end();
  torch::manual_seed(3);
  auto saved = std::make_shared<Fp8Layer>();
  torch::optim::SGD optimizer(std::vector<at::Tensor>{torch::zeros({1}, torch::requires_grad())},
                              torch::optim::SGDOptions(0.1));
  const std::string path = ::testing::TempDir() + "state_fp8.safetensors";
  save_training_state(path, *saved, optimizer, {});
  auto restored = std::make_shared<Fp8Layer>();
  RestoreOptions options;
  options.dtype_policy = DtypePolicy::kConvertUnsupported;
  load_training_state(path, *restored, optimizer, options);
  const at::Tensor weight = restored->named_buffers()["weight"];
  EXPECT_EQ(weight.scalar_type(), bf16 ? at::kBFloat16 : at::kFloat);
  const at::Tensor expected = (saved->weight.to(at::kFloat) * 0.25).to(weight.scalar_type());
  EXPECT_TRUE(at::equal(weight, expected)) << "fp8 values must be multiplied by their stored scale";
}

TEST(TrainingStateDtypes, PoliciesCastOrKeep) {
  const std::string path = ::testing::TempDir() + "state_dtypes.safetensors";
  auto model = make_model(1);
  auto sgd = make_optimizer("SGD", model);
  save_training_state(path, *model, *sgd, {});
  auto restored = make_model(2);
  auto restored_sgd = make_optimizer("SGD", restored);
  RestoreOptions cast;
  cast.dtype_policy = DtypePolicy::kCastFloating;
  cast.cast_to = at::kDouble;
  load_training_state(path, *restored, *restored_sgd, cast);
  for (const auto& p : restored->parameters()) EXPECT_EQ(p.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(restored->parameters()[0].to(at::kFloat), model->parameters()[0]));
}

}  // namespace
}  // namespace torchbridge::checkpoint

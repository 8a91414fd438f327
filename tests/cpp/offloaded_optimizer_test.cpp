// Optimizer-state offload on emu against the same torch optimizer on the device: emu runs the CPU's
// kernels, so the parameters must be bit-identical step after step (Adam and AdamW, one bucket and
// several, a parameter written in place between steps), and the device must hold exactly the optimizer state's size less. Bad parameters raise.
#include <torchbridge/memory/offloaded_optimizer.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "expect_error.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::memory {
namespace {

using test_support::expect_error;

// A function, not a constant: "emu" names a device only once the SDK device is loaded.
c10::Device emu() { return c10::Device("emu:0"); }

torch::nn::Sequential make_model() {
  torch::manual_seed(4);
  torch::nn::Sequential model(torch::nn::Linear(128, 256), torch::nn::GELU(), torch::nn::Linear(256, 128));
  model->to(emu());
  return model;
}

void train_step(torch::nn::Sequential& model, int step) {
  const at::Tensor x = at::randn({16, 128}, at::TensorOptions().dtype(at::kFloat)).add(step).to(emu());
  model->forward(x).pow(2).mean().backward();
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

void expect_same_training(const MakeOptimizer& make, int64_t bucket_bytes) {
  auto on_device_model = make_model();
  auto offloaded_model = make_model();
  auto on_device = make(on_device_model->parameters());
  OffloadedOptimizer offloaded(offloaded_model->parameters(), make, {bucket_bytes});
  for (int step = 0; step < 5; ++step) {
    on_device->zero_grad();
    offloaded.zero_grad();
    torch::manual_seed(100 + step);
    train_step(on_device_model, step);
    torch::manual_seed(100 + step);
    train_step(offloaded_model, step);
    if (step == 2) {  // a write outside the optimizer (as Module::load_state_dict does) must survive
      const at::NoGradGuard no_grad;
      for (auto* model : {&on_device_model, &offloaded_model}) (*model)->parameters()[0].mul_(0.5);
    }
    on_device->step();
    offloaded.step();
    const auto expected = on_device_model->parameters();
    const auto actual = offloaded_model->parameters();
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(at::equal(expected[i].cpu(), actual[i].cpu()))
          << "step " << step << " parameter " << i << " differs by "
          << (expected[i].cpu() - actual[i].cpu()).abs().max().item<float>();
    }
  }
}

class OffloadedOptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override { sdk::load_device("emu"); }
};

TEST_F(OffloadedOptimizerTest, AdamWIsBitIdenticalToAdamWOnTheDevice) {
  expect_same_training([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3).weight_decay(0.05));
  }, 32ll << 20);
}

TEST_F(OffloadedOptimizerTest, AdamWithAmsgradInSeveralBucketsToo) {
  auto make = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).amsgrad(true));
  };
  expect_same_training(make, 64 << 10);  // 64 KiB: the 128 KiB weights get a bucket each
  auto model = make_model();
  EXPECT_EQ(OffloadedOptimizer(model->parameters(), make, {64 << 10}).bucket_count(), 3u);
}

TEST_F(OffloadedOptimizerTest, ParametersWithoutGradientsAreLeftAlone) {
  auto model = make_model();
  OffloadedOptimizer offloaded(model->parameters(), [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.1));
  });
  const at::Tensor frozen = model->parameters()[0];
  const at::Tensor before = frozen.cpu().clone();
  train_step(model, 0);
  frozen.mutable_grad() = at::Tensor();
  offloaded.step();
  EXPECT_TRUE(at::equal(frozen.cpu(), before));
  EXPECT_FALSE(at::equal(model->parameters()[2].cpu(), make_model()->parameters()[2].cpu()));
}

// DataParallel's gradient_as_bucket_view makes gradients views of its buckets, which detach_()
// refuses ("Can't detach views in-place"); zeroing in place must take them, as torch.optim does.
TEST_F(OffloadedOptimizerTest, ZeroingInPlaceTakesGradientsThatAreViews) {
  auto model = make_model();
  OffloadedOptimizer offloaded(model->parameters(), [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.1));
  });
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  const at::Tensor bucket = at::ones({total}, at::TensorOptions().device(emu()));
  int64_t offset = 0;
  for (auto& p : model->parameters()) {
    p.mutable_grad() = bucket.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
  }
  offloaded.zero_grad(/*set_to_none=*/false);
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().is_view());
  EXPECT_TRUE(at::all(bucket.cpu() == 0).item<bool>());
}

// The device's allocator is exact: after a step, the on-device optimizer holds exp_avg and
// exp_avg_sq for every parameter (2 x the parameters' bytes); the offloaded one holds nothing.
TEST_F(OffloadedOptimizerTest, TheDeviceSavesExactlyTheStateSize) {
  auto backend = create_backend("emu");
  auto make = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3));
  };
  auto device_bytes_after_a_step = [&](bool offload) {
    auto model = make_model();
    int64_t parameter_bytes = 0;
    for (const auto& p : model->parameters()) parameter_bytes += p.numel() * 4;
    std::unique_ptr<torch::optim::Optimizer> on_device;
    std::unique_ptr<OffloadedOptimizer> offloaded;
    if (offload) {
      offloaded = std::make_unique<OffloadedOptimizer>(model->parameters(), make);
    } else {
      on_device = make(model->parameters());
    }
    train_step(model, 0);
    backend->synchronize(0);
    const int64_t before = *backend->memory_stats(0).allocated_bytes;
    if (offload) {
      offloaded->step();
    } else {
      on_device->step();
    }
    backend->synchronize(0);
    return std::make_pair(*backend->memory_stats(0).allocated_bytes - before, parameter_bytes);
  };
  const auto [on_device_growth, parameter_bytes] = device_bytes_after_a_step(false);
  const int64_t offloaded_growth = device_bytes_after_a_step(true).first;
  EXPECT_EQ(on_device_growth, 2 * parameter_bytes);
  EXPECT_EQ(offloaded_growth, 0);
}

TEST_F(OffloadedOptimizerTest, BadParametersAreRefused) {
  auto make = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3));
  };
  expect_error([&] { OffloadedOptimizer({at::zeros({4})}, make); }, "parameter 0 is on the CPU");
  expect_error([&] { OffloadedOptimizer({at::zeros({4}, emu()), at::zeros({4}, emu()).to(at::kHalf)}, make); },
               "parameter 1 is Half; float32 parameters are supported");
  expect_error([&] { OffloadedOptimizer({}, make); }, "no parameters were given");
  // meta is not the process's accelerator (emu is)
  expect_error([&] { OffloadedOptimizer({at::zeros({4}, at::TensorOptions().device(c10::kMeta))}, make); },
               "the parameters are on meta, but this process's accelerator is emu, and offload runs on the "
               "accelerator's devices only");
  expect_error([&] { OffloadedOptimizer({at::zeros({4}, emu())}, make, {0}); }, "bucket_bytes must be positive, got 0");
}

}  // namespace
}  // namespace torchbridge::memory

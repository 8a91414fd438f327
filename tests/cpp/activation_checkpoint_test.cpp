// Activation checkpointing against the same computation without it, on the CPU and emu: gradients
// must be bit-identical (with dropout too), through backward() and torch::autograd::grad, with
// inputs that do not require grad, nested regions, several outputs and autocast; misuse raises.
// The comparison with Python's torch.utils.checkpoint is in tests/python/test_memory_checkpoint.py.
#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/memory/activation_checkpoint.h>
#include <torchbridge/memory/checkpoint_sequential.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "collect_warnings.h"
#include "expect_error.h"

#include <string>
#include <vector>

namespace torchbridge::memory {
namespace {

using test_support::expect_error;

class CheckpointTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "emu") sdk::load_device("emu");
  }
  c10::Device device() const { return GetParam() == "emu" ? c10::Device("emu:0") : c10::Device(c10::kCPU); }

  // Seeds the CPU's and the device's generators: emu's random operators may draw from either.
  void seed(uint64_t value) const {
    for (const c10::Device& d : {c10::Device(c10::kCPU), device()}) {
      at::Generator generator = at::globalContext().defaultGenerator(d);
      generator.set_current_seed(value);
    }
  }

  // Two blocks with dropout and layer norm; the same weights for every call with one seed.
  torch::nn::Sequential make_model() const {
    torch::manual_seed(3);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::GELU(), torch::nn::Dropout(0.3),
                                torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})), torch::nn::Linear(32, 32),
                                torch::nn::Tanh(), torch::nn::Dropout(0.2), torch::nn::Linear(32, 8));
    model->to(device());
    model->train();
    return model;
  }

  at::Tensor input(bool requires_grad) const {
    return at::randn({4, 16}, at::TensorOptions().dtype(at::kFloat)).to(device()).requires_grad_(requires_grad);
  }
};

std::vector<at::Tensor> gradients_of(torch::nn::Module& model) {
  std::vector<at::Tensor> grads;
  for (const auto& p : model.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().to(at::kCPU) : at::Tensor());
    p.mutable_grad() = at::Tensor();
  }
  return grads;
}

void expect_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined()) << "gradient " << i << " missing without checkpointing";
    ASSERT_TRUE(b[i].defined()) << "gradient " << i << " missing with checkpointing";
    EXPECT_TRUE(at::equal(a[i], b[i])) << "gradient " << i << " differs by " << (a[i] - b[i]).abs().max().item<float>();
  }
}

TEST_P(CheckpointTest, GradientsAreBitIdenticalWithDropout) {
  auto model = make_model();
  const at::Tensor x = input(true);
  seed(11);
  const at::Tensor plain = model->forward(x);
  plain.pow(2).sum().backward();
  std::vector<at::Tensor> expected = gradients_of(*model);
  expected.push_back(x.grad().to(at::kCPU));
  x.mutable_grad() = at::Tensor();

  seed(11);
  const at::Tensor checkpointed = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  EXPECT_TRUE(at::equal(plain.to(at::kCPU), checkpointed.to(at::kCPU)));
  EXPECT_EQ(checkpointed.grad_fn()->name(), "torchbridge::CheckpointBackward");
  checkpointed.pow(2).sum().backward();
  std::vector<at::Tensor> actual = gradients_of(*model);
  actual.push_back(x.grad().to(at::kCPU));
  expect_identical(expected, actual);

  // The recomputation replays the forward pass's random state and then puts back the program's:
  // after backward the generators stand where the forward pass left them.
  const at::Tensor after_backward = at::rand({8}, device()).to(at::kCPU);
  seed(11);
  (void)model->forward(x);
  EXPECT_TRUE(at::equal(after_backward, at::rand({8}, device()).to(at::kCPU)));
}

// The control for the test above: without the replayed random state, the recomputation draws new
// dropout masks and the gradients are wrong. This is what preserve_rng_state prevents.
TEST_P(CheckpointTest, WithoutRandomStateReplayDropoutGradientsDiffer) {
  auto model = make_model();
  const at::Tensor x = input(false);
  seed(11);
  model->forward(x).pow(2).sum().backward();
  const std::vector<at::Tensor> expected = gradients_of(*model);
  seed(11);
  CheckpointOptions options;
  options.preserve_rng_state = false;
  checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x, options).pow(2).sum().backward();
  const std::vector<at::Tensor> actual = gradients_of(*model);
  EXPECT_FALSE(at::equal(expected[0], actual[0]));
}

TEST_P(CheckpointTest, ParametersGetGradientsWhenNoInputRequiresGrad) {
  auto model = make_model();
  model->eval();  // no dropout: compare two separate forward passes
  const at::Tensor x = input(false);
  model->forward(x).sum().backward();
  const std::vector<at::Tensor> expected = gradients_of(*model);
  checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x).sum().backward();
  expect_identical(expected, gradients_of(*model));
}

TEST_P(CheckpointTest, AutogradGradReturnsTheGradientsWithoutTouchingDotGrad) {
  auto model = make_model();
  model->eval();
  const at::Tensor x = input(true);
  const at::Tensor weight = model->parameters()[0];
  const auto expected = torch::autograd::grad({model->forward(x).sum()}, {x, weight});
  const auto actual = torch::autograd::grad(
      {checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x).sum()}, {x, weight});
  ASSERT_EQ(actual.size(), 2u);
  EXPECT_TRUE(at::equal(expected[0].cpu(), actual[0].cpu()));
  EXPECT_TRUE(at::equal(expected[1].cpu(), actual[1].cpu()));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(weight.grad().defined());
}

TEST_P(CheckpointTest, NestedRegionsAndSeveralOutputs) {
  auto model = make_model();
  const at::Tensor x = input(true);
  const at::Tensor scale = at::full({8}, 0.5, device()).requires_grad_(true);  // captured, not an input
  auto region = [&](const std::vector<at::Tensor>& in) {
    const at::Tensor hidden = checkpoint([&](const at::Tensor& h) { return model->forward(h); }, in[0]);
    return std::vector<at::Tensor>{hidden * scale, hidden.sum(1), at::argmax(hidden, 1)};
  };
  seed(5);
  std::vector<at::Tensor> plain;
  {
    const at::Tensor hidden = model->forward(x);
    plain = {hidden * scale, hidden.sum(1), at::argmax(hidden, 1)};
  }
  (plain[0].pow(2).sum() + plain[1].sum()).backward();
  std::vector<at::Tensor> expected = gradients_of(*model);
  expected.push_back(x.grad().cpu());
  expected.push_back(scale.grad().cpu());
  x.mutable_grad() = at::Tensor();
  scale.mutable_grad() = at::Tensor();

  seed(5);
  const std::vector<at::Tensor> outputs = checkpoint(region, {x});
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_FALSE(outputs[2].requires_grad());  // an integer output passes through untouched
  EXPECT_TRUE(at::equal(outputs[2].cpu(), plain[2].cpu()));
  (outputs[0].pow(2).sum() + outputs[1].sum()).backward();
  std::vector<at::Tensor> actual = gradients_of(*model);
  actual.push_back(x.grad().cpu());
  actual.push_back(scale.grad().cpu());
  expect_identical(expected, actual);
}

// Hooks on the tensors a region's gradients reach (a parameter's register_hook, retain_grad on a
// non-leaf input, a hook on a captured tensor) run once per backward, as without checkpointing,
// also when regions nest. The nested backward once captured gradients at those tensors' own
// nodes, where autograd runs the hooks before capturing, and the outer pass ran them again: a hook
// that doubles a gradient quadrupled it, and retain_grad kept twice the gradient.
TEST_P(CheckpointTest, TensorHooksRunOnceAsWithoutCheckpointing) {
  for (const bool nested : {false, true}) {
    SCOPED_TRACE(nested ? "nested regions" : "one region");
    auto model = make_model();
    model->eval();  // no dropout: the two runs draw no random numbers
    const at::Tensor leaf = input(true);
    const at::Tensor scale_leaf = at::full({8}, 0.5, device()).requires_grad_(true);
    int weight_hook_calls = 0;
    int scale_hook_calls = 0;
    model->parameters()[0].register_hook([&](const at::Tensor& grad) {
      ++weight_hook_calls;
      return grad * 2;
    });
    // Without checkpointing, with one region, or with a region inside another.
    auto run = [&](bool checkpointed) {
      weight_hook_calls = scale_hook_calls = 0;
      const at::Tensor x = leaf * 1.5;  // a non-leaf input
      x.retain_grad();
      const at::Tensor scale = scale_leaf * 1.0;  // captured by the region, not an input
      scale.register_hook([&](const at::Tensor& grad) {
        ++scale_hook_calls;
        return grad * 3;
      });
      auto inner = [&](const at::Tensor& in) { return model->forward(in) * scale; };
      auto inner_checkpointed = [&](const at::Tensor& in) { return checkpoint(inner, in); };
      at::Tensor y;
      if (!nested) {
        y = checkpointed ? inner_checkpointed(x) : inner(x);
      } else if (!checkpointed) {
        y = inner(x.sin()) + x.sum();
      } else {
        y = checkpoint([&](const at::Tensor& in) { return inner_checkpointed(in.sin()) + in.sum(); }, x);
      }
      y.pow(2).sum().backward();
      EXPECT_EQ(weight_hook_calls, 1) << "the parameter's hook, checkpointed: " << checkpointed;
      EXPECT_EQ(scale_hook_calls, 1) << "the captured tensor's hook, checkpointed: " << checkpointed;
      std::vector<at::Tensor> grads = gradients_of(*model);
      grads.push_back(x.grad().cpu());
      grads.push_back(leaf.grad().cpu());
      grads.push_back(scale_leaf.grad().cpu());
      leaf.mutable_grad() = at::Tensor();
      scale_leaf.mutable_grad() = at::Tensor();
      return grads;
    };
    const std::vector<at::Tensor> expected = run(false);
    expect_identical(expected, run(true));
  }
}

TEST_P(CheckpointTest, RecomputationRunsUnderTheForwardPassAutocast) {
  auto model = make_model();
  model->eval();
  const at::Tensor x = input(true);
  const c10::ScalarType low = GetParam() == "emu" ? at::kHalf : at::kBFloat16;
  at::Tensor plain_out, checkpointed_out;
  {
    amp::AutocastScope autocast(device().type(), {low});
    plain_out = model->forward(x);
  }
  plain_out.to(at::kFloat).sum().backward();
  const std::vector<at::Tensor> expected = gradients_of(*model);
  {
    amp::AutocastScope autocast(device().type(), {low});
    checkpointed_out = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  }
  EXPECT_EQ(checkpointed_out.scalar_type(), plain_out.scalar_type());
  // Backward runs outside the autocast region, as in a training loop.
  checkpointed_out.to(at::kFloat).sum().backward();
  expect_identical(expected, gradients_of(*model));
}

TEST_P(CheckpointTest, SequentialSegmentsAndTheWrapperModule) {
  auto model = make_model();
  const at::Tensor x = input(true);
  seed(9);
  model->forward(x).pow(2).sum().backward();
  const std::vector<at::Tensor> expected = gradients_of(*model);

  seed(9);
  checkpoint_sequential(model, 3, x).pow(2).sum().backward();
  expect_identical(expected, gradients_of(*model));

  CheckpointedSequential wrapper(model, 2);
  EXPECT_EQ(wrapper->named_parameters().keys(), model->named_parameters().keys());
  seed(9);
  wrapper->forward(x).pow(2).sum().backward();
  expect_identical(expected, gradients_of(*model));
}

TEST_P(CheckpointTest, RetainGraphAllowsASecondBackwardAndOtherwiseItIsRefused) {
  auto model = make_model();
  model->eval();
  const at::Tensor x = input(true);
  const at::Tensor loss = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x).sum();
  loss.backward({}, /*retain_graph=*/true);
  const at::Tensor once = x.grad().clone();
  loss.backward();
  EXPECT_TRUE(at::allclose(x.grad(), once * 2));
  expect_error([&] { loss.backward(); }, "backward through a checkpointed region a second time");
}

TEST_P(CheckpointTest, InPlaceChangesOfInputsAreRefused) {
  auto model = make_model();
  model->eval();
  const at::Tensor x = input(false);
  const at::Tensor y = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  x.add_(1);
  expect_error([&] { y.sum().backward(); }, "input 0 was modified in place after the region's forward pass");
  expect_error([&] { checkpoint([](const at::Tensor& in) { return in.mul_(2); }, input(false)); },
               "input 0 was modified in place by the region itself");
}

TEST_P(CheckpointTest, AFunctionThatChangesOnRecomputationIsRefused) {
  const at::Tensor x = input(true);
  int calls = 0;
  const at::Tensor y = checkpoint(
      [&](const at::Tensor& in) { return ++calls == 1 ? in * 2 : at::cat({in, in}) * 2; }, x);
  expect_error([&] { y.sum().backward(); },
               "output 0 was Float [4, 16] on " + device().str() + " in the forward pass but Float [8, 16]");
}

TEST_P(CheckpointTest, WithoutGradModeTheFunctionSimplyRuns) {
  auto model = make_model();
  model->eval();
  const at::Tensor x = input(true);
  torch::autograd::GradMode::set_enabled(false);
  const at::Tensor y = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  torch::autograd::GradMode::set_enabled(true);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(at::equal(y.cpu(), model->forward(x).detach().cpu()));
}

// A region nothing in it trains (frozen layers, inputs without grad) runs as torch's does, with a
// warning that says why checkpointing it achieves nothing and what a backward through it will say.
// The warning is given once per process, so this is one test, on the CPU.
TEST(CheckpointWarning, ARegionWithoutGradientsRunsAndWarns) {
  torch::nn::Sequential model(torch::nn::Linear(16, 8), torch::nn::Tanh());
  for (auto& p : model->parameters()) p.requires_grad_(false);
  const at::Tensor x = at::randn({4, 16});
  const test_support::CollectWarnings warnings;
  const at::Tensor y = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(warnings.any_contains("none of the region's 1 outputs requires grad")) << warnings.joined();
  expect_error([&] { y.sum().backward(); }, "does not require grad");
}

// Memory is not a timing: the caching allocator's peak is exact. Twelve wide blocks checkpointed
// one by one must hold far fewer activations at the peak than the plain chain.
TEST(CheckpointMemory, CheckpointingLowersThePeakOnEmu) {
  sdk::load_device("emu");
  const c10::Device emu("emu:0");
  torch::nn::Sequential model;
  for (int i = 0; i < 12; ++i) {
    model->push_back(torch::nn::Linear(256, 256));
    model->push_back(torch::nn::GELU());
  }
  model->to(emu);
  const at::Tensor x = at::randn({512, 256}).to(emu);
  auto backend = create_backend("emu");
  auto peak_of = [&](const std::function<at::Tensor()>& forward) {
    backend->synchronize(0);
    const int64_t before = *backend->memory_stats(0).allocated_bytes;
    backend->reset_peak_memory_stats(0);
    forward().sum().backward();
    backend->synchronize(0);
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    return *backend->memory_stats(0).peak_allocated_bytes - before;
  };
  const int64_t plain = peak_of([&] { return model->forward(x); });
  const int64_t checkpointed = peak_of([&] { return CheckpointedSequential(model, 2)->forward(x); });
  // Plain: 24 activations of 512 KiB (each Linear and GELU saves its input). Checkpointed: the 12
  // group boundaries plus one group's activations during its recomputation.
  EXPECT_LT(static_cast<double>(checkpointed), 0.7 * static_cast<double>(plain))
      << "plain peak " << plain << " B, checkpointed " << checkpointed << " B";
}

INSTANTIATE_TEST_SUITE_P(Devices, CheckpointTest, ::testing::Values("cpu", "emu"));

}  // namespace
}  // namespace torchbridge::memory

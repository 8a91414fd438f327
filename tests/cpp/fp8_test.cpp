// FP8 on the CPU and on emu: delayed scaling against arithmetic done here, the emulated matmul
// against torch's own _scaled_mm kernel (CPU), Fp8Linear's forward and backward against a
// reference written with plain ATen ops, conversion of torch::nn models, and a short training run
// against float32.
#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/amp/fp8.h>
#include <torchbridge/amp/fp8_conversion.h>
#include <torchbridge/amp/fp8_linear.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "expect_error.h"

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace torchbridge::amp {
namespace {

using test_support::expect_error;

float item(const at::Tensor& t) { return t.to(at::kCPU).item<float>(); }

// The recipe written out with plain ATen ops: scale = fp8_max / amax, saturating cast, and the
// dequantized value q * (1 / scale).
at::Tensor fake_quantize(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType fp8, double max_value) {
  const at::Tensor q = (x.to(at::kFloat) * scale).clamp(-max_value, max_value).to(fp8);
  return q.to(at::kFloat) * scale.reciprocal();
}

at::Tensor just_in_time_scale(const at::Tensor& x, double max_value) {
  return at::full({}, max_value, at::kFloat).to(x.device()) / x.detach().to(at::kFloat).abs().amax();
}

TEST(Fp8Format, NamesAndLimits) {
  EXPECT_EQ(fp8_scalar_type(Fp8Format::kE4M3), at::kFloat8_e4m3fn);
  EXPECT_EQ(fp8_scalar_type(Fp8Format::kE5M2), at::kFloat8_e5m2);
  // The largest finite values of the two formats, as torch.finfo states them.
  EXPECT_EQ(fp8_max(Fp8Format::kE4M3), 448.0);
  EXPECT_EQ(fp8_max(Fp8Format::kE5M2), 57344.0);
  EXPECT_EQ(parse_fp8_format("e5m2"), Fp8Format::kE5M2);
  expect_error([] { parse_fp8_format("e3m4"); }, "unknown fp8 format 'e3m4': expected e4m3 or e5m2");
  expect_error([] { parse_fp8_matmul_kernel("cublas"); }, "unknown fp8 matmul kernel 'cublas'");
  expect_error([] { DelayedScalingOptions{0, 0}.validate(); }, "amax_history_length must be at least 1, got 0");
  expect_error([] { DelayedScalingOptions{16, -1}.validate(); }, "margin must be between 0 and 64");
}

TEST(Fp8Scaling, FirstQuantizationUsesTheTensorsOwnAmaxThenTheHistory) {
  const DelayedScalingOptions options{4, 0};
  Fp8ScalingState state = Fp8ScalingState::create(4, c10::kCPU);
  const at::Tensor first = at::tensor({0.5f, -2.0f, 1.0f});
  Fp8Tensor q = quantize_delayed(first, Fp8Format::kE4M3, options, state);
  EXPECT_EQ(item(state.scale), 448.0f / 2.0f);
  EXPECT_EQ(item(q.scale_inverse), 2.0f / 448.0f);
  EXPECT_TRUE(at::equal(state.amax_history, at::tensor({2.0f, 0.0f, 0.0f, 0.0f})));
  // Powers of two times 224 are exact in e4m3: the values come back unchanged.
  EXPECT_TRUE(at::equal(q.data.to(at::kFloat) * q.scale_inverse, first));

  // Delayed: a larger tensor is quantized with the scale of the history (amax 2), so it saturates.
  q = quantize_delayed(at::tensor({8.0f, 1.0f}), Fp8Format::kE4M3, options, state);
  EXPECT_EQ(item(state.scale), 224.0f);
  EXPECT_EQ(q.data.to(at::kFloat)[0].item<float>(), 448.0f);
  EXPECT_TRUE(at::equal(state.amax_history, at::tensor({8.0f, 2.0f, 0.0f, 0.0f})));
  // Now the history's max is 8.
  quantize_delayed(at::tensor({1.0f}), Fp8Format::kE4M3, options, state);
  EXPECT_EQ(item(state.scale), 448.0f / 8.0f);
}

TEST(Fp8Scaling, HistoryForgetsAfterItsLengthAndMarginLeavesHeadroom) {
  const DelayedScalingOptions options{2, 1};
  Fp8ScalingState state = Fp8ScalingState::create(2, c10::kCPU);
  quantize_delayed(at::tensor({4.0f}), Fp8Format::kE5M2, options, state);
  EXPECT_EQ(item(state.scale), 57344.0f / (4.0f * 2.0f));  // margin 1: one binade of headroom
  quantize_delayed(at::tensor({1.0f}), Fp8Format::kE5M2, options, state);
  quantize_delayed(at::tensor({1.0f}), Fp8Format::kE5M2, options, state);
  quantize_delayed(at::tensor({1.0f}), Fp8Format::kE5M2, options, state);
  // The amax 4 left the two-entry history two quantizations ago.
  EXPECT_EQ(item(state.scale), 57344.0f / 2.0f);
}

TEST(Fp8Scaling, ZeroInfAndNaNKeepTheScaleAndDoNotEnterTheHistory) {
  const DelayedScalingOptions options{3, 0};
  Fp8ScalingState state = Fp8ScalingState::create(3, c10::kCPU);
  quantize_delayed(at::zeros({5}), Fp8Format::kE4M3, options, state);
  EXPECT_EQ(item(state.scale), 1.0f);  // nothing to scale by: the initial scale stays
  quantize_delayed(at::tensor({2.0f}), Fp8Format::kE4M3, options, state);
  EXPECT_EQ(item(state.scale), 224.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const Fp8Tensor q = quantize_delayed(at::tensor({inf, 1.0f}), Fp8Format::kE4M3, options, state);
  EXPECT_EQ(item(state.scale), 224.0f);
  EXPECT_EQ(q.data.to(at::kFloat)[0].item<float>(), 448.0f);  // saturated, not inf
  quantize_delayed(at::tensor({std::nanf(""), 1.0f}), Fp8Format::kE4M3, options, state);
  EXPECT_TRUE(at::equal(state.amax_history, at::tensor({0.0f, 0.0f, 2.0f})));
}

TEST(Fp8Scaling, RejectsAHistoryOfTheWrongLengthAndNonFloatInput) {
  Fp8ScalingState state = Fp8ScalingState::create(4, c10::kCPU);
  expect_error([&] { quantize_delayed(at::ones({2}), Fp8Format::kE4M3, DelayedScalingOptions{8, 0}, state); },
               "the amax history must have 8 entries");
  expect_error([&] { quantize_delayed(at::ones({2}, at::kLong), Fp8Format::kE4M3, DelayedScalingOptions{4, 0}, state); },
               "must be a float32/bf16/fp16 tensor, got Long");
}

// The emulation is meant to be _scaled_mm's numerics: on the CPU, torch has a _scaled_mm kernel to
// check it against. Where no dimension needs padding the two are bit-identical; where _scaled_mm
// gets operands zero-padded to multiples of 16, the CPU's BLAS may block the longer sums
// differently (bit-identical on an AVX512 Xeon, 1-ulp differences on an AVX-only EPYC), so those
// agree to rounding.
TEST(Fp8Matmul, EmulationEqualsTorchsScaledMmKernel) {
  at::manual_seed(0);
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{32, 64, 48}, {7, 40, 24}, {5, 16, 20}}) {
    Fp8ScalingState sa = Fp8ScalingState::create(1, c10::kCPU), sb = Fp8ScalingState::create(1, c10::kCPU);
    const Fp8Tensor a = quantize_delayed(at::randn({m, k}), Fp8Format::kE5M2, {1, 0}, sa);
    const Fp8Tensor b = quantize_delayed(at::randn({n, k}), Fp8Format::kE4M3, {1, 0}, sb);
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor emulated = fp8_matmul(a.data, a.scale_inverse, b.data.t(), b.scale_inverse, dtype,
                                             Fp8MatmulKernel::kEmulated);
      const at::Tensor kernel = fp8_matmul(a.data, a.scale_inverse, b.data.t(), b.scale_inverse, dtype,
                                           Fp8MatmulKernel::kScaledMm);
      EXPECT_EQ(emulated.scalar_type(), dtype);
      EXPECT_EQ(emulated.sizes(), (std::vector<int64_t>{m, n}));
      const bool padded = m % 16 != 0 || k % 16 != 0 || n % 16 != 0;
      if (!padded) {
        EXPECT_TRUE(at::equal(emulated, kernel)) << m << "x" << k << "x" << n << " " << dtype;
      } else {
        // float32: a few ulps; bf16: one rounding step of the result (2^-8 relative).
        const double rtol = dtype == at::kFloat ? 1e-5 : 1.0 / 128;
        EXPECT_TRUE(at::allclose(emulated.to(at::kFloat), kernel.to(at::kFloat), rtol, 1e-6))
            << m << "x" << k << "x" << n << " " << dtype << " max |diff| "
            << (emulated.to(at::kFloat) - kernel.to(at::kFloat)).abs().max().item<float>();
      }
    }
  }
  // auto resolves to the emulation on a CPU: no CPU has FP8 matrix units.
  EXPECT_EQ(resolve_fp8_matmul_kernel(Fp8MatmulKernel::kAuto, c10::kCPU), Fp8MatmulKernel::kEmulated);
}

TEST(Fp8Matmul, RejectsWhatScaledMmCannotDo) {
  const at::Tensor e5 = at::ones({16, 16}).to(at::kFloat8_e5m2), e4 = at::ones({16, 16}).to(at::kFloat8_e4m3fn);
  const at::Tensor one = at::ones({});
  expect_error([&] { fp8_matmul(e5, one, e5, one, at::kFloat); }, "e5m2 x e5m2 is not supported");
  expect_error([&] { fp8_matmul(at::ones({16, 16}), one, e4, one, at::kFloat); },
               "both operands must be float8_e4m3fn or float8_e5m2 tensors, got Float");
  expect_error([&] { fp8_matmul(e4, one, at::ones({8, 16}).to(at::kFloat8_e4m3fn), one, at::kFloat); },
               "expected a [M, K] and b [K, N], got [16, 16] and [8, 16]");
  expect_error([&] { fp8_matmul(e4, at::ones({2}), e4, one, at::kFloat); },
               "a_scale_inverse must be a float32 tensor with one element");
}

class Fp8LinearTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "emu") return;
    sdk::load_device("emu");
    // Run in one gtest process after a CPU backward pass, autograd cannot serve emu (CTest gives
    // each test its own process).
    if (const auto why = sdk::autograd_refusal()) GTEST_SKIP() << *why;
  }
  c10::Device device() const { return GetParam() == "emu" ? c10::Device("emu:0") : c10::Device(c10::kCPU); }
};

TEST_P(Fp8LinearTest, ForwardAndBackwardFollowTheRecipe) {
  at::manual_seed(1);
  Fp8LinearOptions options(32, 48);
  options.kernel = Fp8MatmulKernel::kEmulated;
  Fp8Linear layer(options);
  layer->to(device());
  const at::Tensor x = at::randn({2, 5, 32}).to(device()).set_requires_grad(true);
  const at::Tensor grad = at::randn({2, 5, 48}).to(device());
  const at::Tensor y = layer(x);
  y.backward(grad);

  // The reference: each of x, W and dy quantized with its own just-in-time scale (the first step's
  // rule), dequantized, and multiplied in float32.
  const at::Tensor w = layer->weight.detach();
  const at::Tensor xq = fake_quantize(x.detach(), just_in_time_scale(x, 448), at::kFloat8_e4m3fn, 448);
  const at::Tensor wq = fake_quantize(w, just_in_time_scale(w, 448), at::kFloat8_e4m3fn, 448);
  const at::Tensor gq = fake_quantize(grad, just_in_time_scale(grad, 57344), at::kFloat8_e5m2, 57344);
  const at::Tensor expected_y = at::matmul(xq, wq.t()) + layer->bias.detach();
  const at::Tensor expected_dx = at::matmul(gq, wq);
  const at::Tensor expected_dw = at::matmul(gq.reshape({-1, 48}).t(), xq.reshape({-1, 32}));
  EXPECT_TRUE(at::allclose(y, expected_y, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(x.grad(), expected_dx, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(layer->weight.grad(), expected_dw, 1e-5, 1e-5));
  // IntArrayRef named: in torch 2.11 a bare {0, 1} is ambiguous between sum's overloads.
  EXPECT_TRUE(at::equal(layer->bias.grad(), grad.sum(at::IntArrayRef{0, 1})));

  // And it is a Linear up to FP8's rounding: e4m3 keeps 3 mantissa bits.
  const at::Tensor exact = at::linear(x.detach(), w, layer->bias.detach());
  EXPECT_LT(item((y.detach() - exact).abs().max() / exact.abs().max()), 0.1f);
  // The scaling state now holds the first step's amaxes.
  EXPECT_EQ(item(layer->input_scaling.amax_history[0]), item(x.detach().abs().max()));
  EXPECT_EQ(item(layer->grad_output_scaling.amax_history[0]), item(grad.abs().max()));
  EXPECT_EQ(layer->input_scaling.amax_history.device(), device());
}

TEST_P(Fp8LinearTest, GivesTheCpusNumbersBitForBit) {
  at::manual_seed(2);
  Fp8LinearOptions options(16, 32);
  Fp8Linear on_cpu(options);
  Fp8Linear on_device(options);
  on_device->weight.data().copy_(on_cpu->weight.detach());
  on_device->bias.data().copy_(on_cpu->bias.detach());
  on_device->to(device());
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({8, 16});
    const at::Tensor grad = at::randn({8, 32});
    const at::Tensor xc = x.clone().set_requires_grad(true), xd = x.to(device()).set_requires_grad(true);
    const at::Tensor yd = on_device(xd), yc = on_cpu(xc);
    yd.backward(grad.to(device()));
    yc.backward(grad);
    EXPECT_TRUE(at::equal(yd.cpu(), yc)) << "step " << step;
    EXPECT_TRUE(at::equal(xd.grad().cpu(), xc.grad())) << "step " << step;
    EXPECT_TRUE(at::equal(on_device->weight.grad().cpu(), on_cpu->weight.grad())) << "step " << step;
  }
}

TEST_P(Fp8LinearTest, UnderAutocastTheOutputHasTheAutocastDtypeAndGradientsTheParameters) {
  Fp8Linear layer(Fp8LinearOptions(16, 16));
  layer->to(device());
  const at::Tensor x = at::randn({4, 16}).to(device()).set_requires_grad(true);
  at::Tensor y;
  {
    AutocastScope autocast(device().type(), AutocastOptions{at::kBFloat16});
    y = layer(x);
  }
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.to(at::kFloat).sum().backward();
  EXPECT_EQ(layer->weight.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
}

TEST_P(Fp8LinearTest, ConvertedSequentialTrainsLikeFloat32) {
  at::manual_seed(3);
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::GELU(), torch::nn::Linear(64, 16));
  };
  torch::nn::Sequential reference = make(), fp8 = make();
  for (size_t i = 0; i < reference->parameters().size(); ++i) {
    fp8->parameters()[i].data().copy_(reference->parameters()[i].detach());
  }
  reference->to(device());
  fp8->to(device());
  const Fp8ConversionReport report = convert_to_fp8(*fp8);
  ASSERT_EQ(report.converted.size(), 2u) << report.summary();
  EXPECT_EQ(report.converted[0].name, "0");
  EXPECT_NE(fp8->ptr(0)->as<Fp8LinearImpl>(), nullptr);

  const at::Tensor inputs = at::randn({64, 32}).to(device());
  const at::Tensor targets = at::randn({64, 16}).to(device());
  torch::optim::SGD ref_opt(reference->parameters(), 0.05), fp8_opt(fp8->parameters(), 0.05);
  auto step = [&](torch::nn::Sequential& model, torch::optim::SGD& optimizer) {
    optimizer.zero_grad();
    at::Tensor loss = at::mse_loss(model->forward(inputs), targets);
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  };
  double ref_loss = 0, fp8_loss = 0;
  for (int i = 0; i < 30; ++i) {
    ref_loss = step(reference, ref_opt);
    fp8_loss = step(fp8, fp8_opt);
  }
  // Both learned, and FP8's loss stays within 5% of float32's after 30 steps.
  EXPECT_LT(ref_loss, 1.0);
  EXPECT_NEAR(fp8_loss, ref_loss, 0.05 * ref_loss) << "float32 " << ref_loss << ", fp8 " << fp8_loss;
}

INSTANTIATE_TEST_SUITE_P(Devices, Fp8LinearTest, ::testing::Values("cpu", "emu"));

// A module that calls its layers through member holders, as most LibTorch code does.
struct TwoLayers : torch::nn::Module {
  TwoLayers() {
    hidden = register_module("hidden", torch::nn::Linear(32, 32));
    odd = register_module("odd", torch::nn::Linear(32, 10));
  }
  torch::nn::Linear hidden{nullptr}, odd{nullptr};
};

TEST(Fp8Conversion, ReportsWhatItCouldNotConvertAndWhy) {
  TwoLayers model;
  const Fp8ConversionReport report = convert_to_fp8(model);
  EXPECT_TRUE(report.converted.empty());
  ASSERT_EQ(report.skipped.size(), 2u);
  EXPECT_EQ(report.skipped[0].name, "hidden");
  EXPECT_NE(report.skipped[0].reason.find("member ModuleHolder"), std::string::npos);
  EXPECT_EQ(report.skipped[1].name, "odd");
  EXPECT_NE(report.skipped[1].reason.find("out_features 10 must both be multiples of 16"), std::string::npos);
  // Nothing was swapped: the registry and the members still agree.
  EXPECT_EQ(model.named_children()["hidden"].get(), model.hidden.ptr().get());
}

TEST(Fp8Conversion, KeepsParametersSoAnExistingOptimizerStillUpdatesTheModel) {
  torch::nn::Sequential model(torch::nn::Linear(16, 16), torch::nn::ReLU(), torch::nn::Linear(16, 32));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  Fp8ConversionOptions options;
  options.filter = [](const std::string& name, const torch::nn::LinearImpl&) { return name != "2"; };
  const Fp8ConversionReport report = convert_to_fp8(*model, options);
  ASSERT_EQ(report.converted.size(), 1u);
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_EQ(report.skipped[0].reason, "excluded by the filter");
  EXPECT_NE(report.summary().find("converted 0 (16 -> 16)"), std::string::npos) << report.summary();

  const at::Tensor before = model->ptr(0)->as<Fp8LinearImpl>()->weight.detach().clone();
  model->forward(at::randn({4, 16})).sum().backward();
  optimizer.step();
  EXPECT_FALSE(at::equal(model->ptr(0)->as<Fp8LinearImpl>()->weight.detach(), before));
}

}  // namespace
}  // namespace torchbridge::amp

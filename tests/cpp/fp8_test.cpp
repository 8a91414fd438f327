// FP8 on the CPU and on emu: delayed scaling against arithmetic done here, the emulated matmul
// against torch's own _scaled_mm kernel (CPU), Fp8Linear's forward and backward against a
// reference written with plain ATen ops, conversion of torch::nn models, and a short training run
// against float32.
#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/amp/fp8.h>
#include <torchbridge/amp/fp8_conversion.h>
#include <torchbridge/amp/fp8_linear.h>
#include <torchbridge/backend.h>
#include <torchbridge/memory/activation_checkpoint.h>
#include <torchbridge/registry.h>
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
#include <memory>
#include <optional>
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

// On the first step the history is empty and the step's own amax gives the scale: an inf there
// made the scale 448 / inf = 0, and every quantized value NaN, rows without the inf included. So
// did an amax whose 2^margin headroom overflows float32.
TEST(Fp8Scaling, AnInfiniteOrOverflowingFirstAmaxKeepsTheInitialScale) {
  const float inf = std::numeric_limits<float>::infinity();
  Fp8ScalingState state = Fp8ScalingState::create(3, c10::kCPU);
  const Fp8Tensor q = quantize_delayed(at::tensor({inf, 1.0f, -2.0f}), Fp8Format::kE4M3, {3, 0}, state);
  EXPECT_EQ(item(state.scale), 1.0f);
  EXPECT_TRUE(at::equal(q.data.to(at::kFloat), at::tensor({448.0f, 1.0f, -2.0f})));  // saturated, no NaN
  Fp8ScalingState headroom = Fp8ScalingState::create(3, c10::kCPU);
  quantize_delayed(at::tensor({1e30f}), Fp8Format::kE5M2, {3, 64}, headroom);  // 1e30 * 2^64 overflows float32
  EXPECT_EQ(item(headroom.scale), 1.0f);
}

TEST(Fp8Scaling, RejectsAHistoryOfTheWrongLengthAndNonFloatInput) {
  Fp8ScalingState state = Fp8ScalingState::create(4, c10::kCPU);
  expect_error([&] { quantize_delayed(at::ones({2}), Fp8Format::kE4M3, DelayedScalingOptions{8, 0}, state); },
               "the amax history must have 8 entries");
  expect_error([&] { quantize_delayed(at::ones({2}, at::kLong), Fp8Format::kE4M3, DelayedScalingOptions{4, 0}, state); },
               "must be a float32/bf16/fp16 tensor, got Long");
}

// quantize_delayed against the recipe written out here, bit for bit, for every input dtype, both
// formats, and values that saturate, overflow or are NaN; quantize_delayed_into writes the same.
TEST(Fp8Scaling, QuantizationEqualsTheRecipeForEveryInputDtype) {
  at::manual_seed(4);
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const auto format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      const double max_value = fp8_max(format);
      const c10::ScalarType fp8 = fp8_scalar_type(format);
      Fp8ScalingState state = Fp8ScalingState::create(3, c10::kCPU), twin = Fp8ScalingState::create(3, c10::kCPU);
      at::Tensor expected_history = at::zeros({3});
      std::vector<at::Tensor> inputs{at::randn({37, 21}).mul(3).to(dtype), at::randn({37, 21}).mul(50).to(dtype),
                                     at::randn({5, 8}).to(dtype)};
      inputs[2].index_put_({0, 0}, inf);       // the step's amax is inf: recorded as 0
      inputs[1].index_put_({1, 1}, -1000.0);   // beyond the first step's scale: saturates
      for (const at::Tensor& input : inputs) {
        const at::Tensor amax = input.to(at::kFloat).abs().amax();
        const double history_max = expected_history.max().item<double>();
        const double scale_before = item(state.scale);
        const Fp8Tensor q = quantize_delayed(input, format, {3, 0}, state);
        const at::Tensor into = at::empty(input.sizes(), at::TensorOptions().dtype(fp8));
        const at::Tensor into_inverse = quantize_delayed_into(into, input, format, {3, 0}, twin);

        const float scale = item(state.scale);
        const double used_amax = history_max > 0 ? history_max : amax.item<double>();
        const float expected_scale =
            std::isfinite(used_amax) && used_amax > 0 ? static_cast<float>(max_value / used_amax) : scale_before;
        EXPECT_FLOAT_EQ(scale, expected_scale) << dtype << " " << to_string(format);
        const at::Tensor expected = (input.to(at::kFloat) * state.scale).clamp(-max_value, max_value).to(fp8);
        EXPECT_TRUE(at::equal(q.data.view(at::kByte), expected.view(at::kByte))) << dtype << " " << to_string(format);
        EXPECT_TRUE(at::equal(into.view(at::kByte), expected.view(at::kByte))) << dtype << " " << to_string(format);
        EXPECT_TRUE(at::equal(into_inverse, q.scale_inverse));
        EXPECT_TRUE(at::equal(twin.amax_history, state.amax_history));

        expected_history = at::roll(expected_history, 1);
        expected_history[0] = amax.isfinite().item<bool>() ? amax : at::zeros({});
        EXPECT_TRUE(at::equal(state.amax_history, expected_history)) << state.amax_history << expected_history;
      }
    }
  }
}

TEST(Fp8Scaling, AnEmptyInputLeavesTheStateAsItIs) {
  Fp8ScalingState state = Fp8ScalingState::create(2, c10::kCPU);
  quantize_delayed(at::tensor({2.0f}), Fp8Format::kE4M3, {2, 0}, state);
  const at::Tensor history = state.amax_history.clone(), scale = state.scale.clone();
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const Fp8Tensor q = quantize_delayed(at::empty({0, 16}, dtype), Fp8Format::kE4M3, {2, 0}, state);
    EXPECT_EQ(q.data.sizes(), (std::vector<int64_t>{0, 16}));
    EXPECT_EQ(q.data.scalar_type(), at::kFloat8_e4m3fn);
    EXPECT_EQ(item(q.scale_inverse), 1.0f / 224.0f);
    EXPECT_TRUE(at::equal(state.amax_history, history));
    EXPECT_TRUE(at::equal(state.scale, scale));
  }
}

TEST(Fp8Scaling, QuantizeIntoRejectsADestinationThatDoesNotFit) {
  Fp8ScalingState state = Fp8ScalingState::create(1, c10::kCPU);
  const at::Tensor input = at::ones({2, 3});
  const at::Tensor e4m3 = at::empty({2, 3}, at::kFloat8_e4m3fn), transposed = at::empty({3, 2}, at::kFloat8_e4m3fn);
  expect_error([&] { quantize_delayed_into(transposed, input, Fp8Format::kE4M3, {1, 0}, state); },
               "quantize_delayed_into: data must be a Float8_e4m3fn tensor of the input's shape [2, 3] on cpu, got "
               "Float8_e4m3fn of shape [3, 2] on cpu");
  expect_error([&] { quantize_delayed_into(e4m3, input, Fp8Format::kE5M2, {1, 0}, state); },
               "data must be a Float8_e5m2 tensor");
  // Nothing was quantized: the state did not move.
  EXPECT_TRUE(at::equal(state.amax_history, at::zeros({1})));
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

// fp8_matmul_into writes what fp8_matmul returns, on both kernels, into outputs the kernel can
// write itself (contiguous, N a multiple of 16) and into ones it cannot (strided, N = 20, float64).
TEST(Fp8Matmul, IntoWritesWhatFp8MatmulReturns) {
  at::manual_seed(5);
  for (const int64_t n : {32, 20}) {
    Fp8ScalingState sa = Fp8ScalingState::create(1, c10::kCPU), sb = Fp8ScalingState::create(1, c10::kCPU);
    const Fp8Tensor a = quantize_delayed(at::randn({24, 48}), Fp8Format::kE4M3, {1, 0}, sa);
    const Fp8Tensor b = quantize_delayed(at::randn({n, 48}), Fp8Format::kE5M2, {1, 0}, sb);
    for (const auto kernel : {Fp8MatmulKernel::kEmulated, Fp8MatmulKernel::kScaledMm}) {
      for (const auto dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
        const at::Tensor expected = fp8_matmul(a.data, a.scale_inverse, b.data.t(), b.scale_inverse, dtype, kernel);
        const at::Tensor contiguous = at::full({24, n}, 7.0, at::TensorOptions().dtype(dtype));
        const at::Tensor strided = at::full({n, 24}, 7.0, at::TensorOptions().dtype(dtype)).t();
        for (const at::Tensor& out : {contiguous, strided}) {
          fp8_matmul_into(out, a.data, a.scale_inverse, b.data.t(), b.scale_inverse, kernel);
          EXPECT_TRUE(at::equal(out, expected)) << to_string(kernel) << " " << dtype << " n " << n;
        }
      }
    }
  }
  const at::Tensor e4 = at::ones({16, 16}).to(at::kFloat8_e4m3fn), one = at::ones({});
  expect_error([&] { fp8_matmul_into(at::empty({16, 8}), e4, one, e4, one); },
               "fp8_matmul_into: out must be a [16, 16] tensor on cpu, got Float of shape [16, 8] on cpu");
  // An integer or bool result was the product truncated, silently.
  expect_error([&] { fp8_matmul(e4, one, e4, one, at::kInt); },
               "fp8_matmul: out_dtype must be a floating-point dtype, got Int");
  expect_error([&] { fp8_matmul_into(at::empty({16, 16}, at::kBool), e4, one, e4, one); },
               "fp8_matmul_into: out must be a floating-point tensor, got Bool");
}

// No kernel is given an empty operand: M = 0 or N = 0 give an empty product, K = 0 gives zeros.
TEST(Fp8Matmul, EmptyDimensionsGiveAnEmptyOrZeroProduct) {
  const at::Tensor one = at::ones({});
  for (const auto kernel : {Fp8MatmulKernel::kEmulated, Fp8MatmulKernel::kScaledMm}) {
    for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{0, 16, 16}, {16, 16, 0}, {16, 0, 32}}) {
      const at::Tensor a = at::ones({m, k}).to(at::kFloat8_e4m3fn), b = at::ones({k, n}).to(at::kFloat8_e4m3fn);
      const at::Tensor product = fp8_matmul(a, one, b, one, at::kBFloat16, kernel);
      EXPECT_EQ(product.sizes(), (std::vector<int64_t>{m, n}));
      EXPECT_EQ(product.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::equal(product, at::zeros({m, n}, at::kBFloat16)));
      const at::Tensor out = at::full({m, n}, 3.0);
      fp8_matmul_into(out, a, one, b, one, kernel);
      EXPECT_TRUE(at::equal(out, at::zeros({m, n})));
    }
  }
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

// As torch::nn::Linear does, a batch of no tokens gives an empty output and zero gradients, and
// it leaves the scaling state alone.
TEST_P(Fp8LinearTest, AnEmptyBatchGivesAnEmptyOutputAndZeroGradients) {
  Fp8Linear layer(Fp8LinearOptions(16, 32));
  layer->to(device());
  layer(at::randn({4, 16}).to(device())).sum().backward();
  const at::Tensor history = layer->input_scaling.amax_history.cpu();
  layer->zero_grad();
  const at::Tensor x = at::randn({2, 0, 16}).to(device()).set_requires_grad(true);
  const at::Tensor y = layer(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 0, 32}));
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
  EXPECT_TRUE(at::equal(layer->weight.grad().cpu(), at::zeros({32, 16})));
  EXPECT_TRUE(at::equal(layer->bias.grad().cpu(), at::zeros({32})));
  EXPECT_TRUE(at::equal(layer->input_scaling.amax_history.cpu(), history));
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

// Activation checkpointing recomputes the layer during backward. The recomputation must quantize
// with the scales the forward pass used and leave the scaling state alone: before, it moved the
// scales again, the backward pass differentiated other numbers, and every amax was recorded twice.
TEST_P(Fp8LinearTest, CheckpointingChangesNoGradientAndRecordsEachStepOnce) {
  at::manual_seed(4);
  Fp8Linear plain(Fp8LinearOptions(32, 32));
  Fp8Linear checkpointed(Fp8LinearOptions(32, 32));
  checkpointed->weight.data().copy_(plain->weight.detach());
  checkpointed->bias.data().copy_(plain->bias.detach());
  plain->to(device());
  checkpointed->to(device());
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = (at::randn({8, 32}) * (step + 1)).to(device());
    plain->zero_grad();
    checkpointed->zero_grad();
    plain(x).square().sum().backward();
    memory::checkpoint([&](const at::Tensor& input) { return checkpointed(input); }, x).square().sum().backward();
    EXPECT_TRUE(at::equal(checkpointed->weight.grad(), plain->weight.grad())) << "step " << step;
    EXPECT_TRUE(at::equal(checkpointed->bias.grad(), plain->bias.grad())) << "step " << step;
  }
  EXPECT_TRUE(at::equal(checkpointed->input_scaling.amax_history, plain->input_scaling.amax_history));
  EXPECT_TRUE(at::equal(checkpointed->weight_scaling.scale, plain->weight_scaling.scale));
  EXPECT_EQ(at::count_nonzero(checkpointed->input_scaling.amax_history).item<int64_t>(), 3);
}

INSTANTIATE_TEST_SUITE_P(Devices, Fp8LinearTest, ::testing::Values("cpu", "emu"));

// ---- On an NVIDIA GPU with FP8 units (sm_89+): torch._scaled_mm. Elsewhere these skip, naming why.
// CTest runs each in a process of its own, so emu (loaded by the tests above) never shares it.

std::optional<std::string> why_no_fp8_cuda() {
  const std::shared_ptr<Backend> cuda = BackendRegistry::instance().lookup("cuda");
  if (!cuda->is_available()) return "no NVIDIA GPU: " + cuda->availability().reason;
  if (sdk::autograd_refusal()) return std::string("an SDK device holds this process's autograd");
  if (resolve_fp8_matmul_kernel(Fp8MatmulKernel::kAuto, c10::Device("cuda:0")) != Fp8MatmulKernel::kScaledMm) {
    return std::string("cuda:0 has no FP8 matrix units (sm_89 or newer has them)");
  }
  return std::nullopt;
}

// The device's quantization gives the CPU's bits; _scaled_mm agrees with the emulation to float32
// rounding (its accumulation order is its own); fp8_matmul_into writes what fp8_matmul returns,
// in place (contiguous, N = 48) and through a copy (strided); empty dimensions call no kernel.
TEST(Fp8Cuda, ScaledMmAgreesWithTheEmulationAndWritesOutInPlace) {
  if (const auto why = why_no_fp8_cuda()) GTEST_SKIP() << *why;
  const c10::Device gpu("cuda:0");
  at::manual_seed(6);
  const at::Tensor a_values = at::randn({64, 96}), b_values = at::randn({48, 96}).to(at::kBFloat16);
  Fp8ScalingState sa = Fp8ScalingState::create(4, gpu), sb = Fp8ScalingState::create(4, gpu);
  Fp8ScalingState sa_cpu = Fp8ScalingState::create(4, c10::kCPU), sb_cpu = Fp8ScalingState::create(4, c10::kCPU);
  const Fp8Tensor a = quantize_delayed(a_values.to(gpu), Fp8Format::kE4M3, {4, 0}, sa);
  const Fp8Tensor b = quantize_delayed(b_values.to(gpu), Fp8Format::kE5M2, {4, 0}, sb);
  const Fp8Tensor a_cpu = quantize_delayed(a_values, Fp8Format::kE4M3, {4, 0}, sa_cpu);
  const Fp8Tensor b_cpu = quantize_delayed(b_values, Fp8Format::kE5M2, {4, 0}, sb_cpu);
  EXPECT_TRUE(at::equal(a.data.cpu().view(at::kByte), a_cpu.data.view(at::kByte)));
  EXPECT_TRUE(at::equal(b.data.cpu().view(at::kByte), b_cpu.data.view(at::kByte)));
  EXPECT_TRUE(at::equal(sa.amax_history.cpu(), sa_cpu.amax_history));
  EXPECT_TRUE(at::equal(sb.scale.cpu(), sb_cpu.scale));

  const at::Tensor bt = b.data.t();
  const at::Tensor emulated = fp8_matmul(a.data, a.scale_inverse, bt, b.scale_inverse, at::kFloat,
                                         Fp8MatmulKernel::kEmulated);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor product =
        fp8_matmul(a.data, a.scale_inverse, bt, b.scale_inverse, dtype, Fp8MatmulKernel::kScaledMm);
    EXPECT_EQ(product.device(), gpu);
    const double scale = emulated.abs().max().item<double>();
    EXPECT_TRUE(at::allclose(product.to(at::kFloat), emulated, dtype == at::kFloat ? 1e-4 : 1.0 / 128, 1e-4 * scale))
        << dtype << " max |diff| " << (product.to(at::kFloat) - emulated).abs().max().item<double>();
    const at::Tensor contiguous = at::full({64, 48}, 7.0, at::TensorOptions().dtype(dtype).device(gpu));
    const at::Tensor strided = at::full({48, 64}, 7.0, at::TensorOptions().dtype(dtype).device(gpu)).t();
    for (const at::Tensor& out : {contiguous, strided}) {
      fp8_matmul_into(out, a.data, a.scale_inverse, bt, b.scale_inverse, Fp8MatmulKernel::kScaledMm);
      EXPECT_TRUE(at::equal(out, product)) << dtype << (out.is_contiguous() ? " contiguous" : " strided");
    }
  }
  const at::Tensor none = a.data.narrow(0, 0, 0);
  EXPECT_EQ(fp8_matmul(none, a.scale_inverse, bt, b.scale_inverse, at::kFloat).sizes(),
            (std::vector<int64_t>{0, 48}));
  const at::Tensor over_nothing = fp8_matmul(a.data.narrow(1, 0, 0), a.scale_inverse, bt.narrow(0, 0, 0),
                                             b.scale_inverse, at::kFloat);
  EXPECT_TRUE(at::equal(over_nothing.cpu(), at::zeros({64, 48})));
}

// Fp8Linear on the GPU (_scaled_mm) against the same layer emulated on the CPU: the same scaling
// state, and outputs and gradients equal to float32 rounding; an empty batch as on the CPU.
TEST(Fp8Cuda, LinearMatchesTheCpuEmulationAndTakesAnEmptyBatch) {
  if (const auto why = why_no_fp8_cuda()) GTEST_SKIP() << *why;
  const c10::Device gpu("cuda:0");
  at::manual_seed(7);
  Fp8Linear on_cpu(Fp8LinearOptions(64, 32));
  Fp8Linear on_gpu(Fp8LinearOptions(64, 32));
  on_gpu->weight.data().copy_(on_cpu->weight.detach());
  on_gpu->bias.data().copy_(on_cpu->bias.detach());
  on_gpu->to(gpu);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({16, 64}), grad = at::randn({16, 32});
    const at::Tensor xc = x.clone().set_requires_grad(true), xg = x.to(gpu).set_requires_grad(true);
    const at::Tensor yc = on_cpu(xc), yg = on_gpu(xg);
    yc.backward(grad);
    yg.backward(grad.to(gpu));
    auto close = [](const at::Tensor& gpu_result, const at::Tensor& cpu_result) {
      const double scale = cpu_result.abs().max().item<double>();
      return at::allclose(gpu_result.cpu(), cpu_result, 1e-4, 1e-4 * scale);
    };
    EXPECT_TRUE(close(yg, yc)) << "step " << step;
    EXPECT_TRUE(close(xg.grad(), xc.grad())) << "step " << step;
    EXPECT_TRUE(close(on_gpu->weight.grad(), on_cpu->weight.grad())) << "step " << step;
    EXPECT_TRUE(close(on_gpu->bias.grad(), on_cpu->bias.grad())) << "step " << step;
    EXPECT_TRUE(at::equal(on_gpu->input_scaling.amax_history.cpu(), on_cpu->input_scaling.amax_history));
    EXPECT_TRUE(at::equal(on_gpu->grad_output_scaling.scale.cpu(), on_cpu->grad_output_scaling.scale));
  }
  on_gpu->zero_grad();
  const at::Tensor history = on_gpu->input_scaling.amax_history.cpu();
  const at::Tensor empty = at::randn({0, 64}).to(gpu).set_requires_grad(true);
  const at::Tensor y = on_gpu(empty);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 32}));
  y.sum().backward();
  EXPECT_TRUE(at::equal(on_gpu->weight.grad().cpu(), at::zeros({32, 64})));
  EXPECT_TRUE(at::equal(on_gpu->input_scaling.amax_history.cpu(), history));
}

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

// A Linear at two positions of one Sequential and shared by two Sequentials: before, the first
// name's swap found the layer still held by its other registration, undid itself, and reported
// the layer as held outside the registry.
TEST(Fp8Conversion, ALinearRegisteredUnderSeveralNamesBecomesOneFp8LinearAtAllOfThem) {
  torch::nn::Linear twice(16, 16), shared(16, 32);
  torch::nn::Sequential repeated(twice, torch::nn::ReLU(), twice);
  torch::nn::Sequential first(shared), second(torch::nn::ReLU(), shared);
  torch::nn::Module model;
  model.register_module("repeated", repeated);
  model.register_module("first", first);
  model.register_module("second", second);
  twice = nullptr;  // only the model holds the layers now
  shared = nullptr;

  const Fp8ConversionReport report = convert_to_fp8(model);
  ASSERT_EQ(report.converted.size(), 2u) << report.summary();
  EXPECT_EQ(report.converted[0].name, "repeated.0");
  EXPECT_EQ(report.converted[1].name, "first.0");
  EXPECT_TRUE(report.skipped.empty()) << report.summary();
  ASSERT_EQ(report.aliases.size(), 2u);
  EXPECT_EQ(report.aliases[0].name, "repeated.2");
  EXPECT_EQ(report.aliases[1].name, "second.1");
  EXPECT_NE(report.summary().find("second.1 is first.0, converted with it"), std::string::npos) << report.summary();

  // One Fp8Linear at every name, in the registries and in the element lists forward calls.
  EXPECT_NE(repeated->ptr(0)->as<Fp8LinearImpl>(), nullptr);
  EXPECT_EQ(repeated->ptr(0).get(), repeated->ptr(2).get());
  EXPECT_EQ(repeated->named_children()["2"].get(), repeated->ptr(0).get());
  EXPECT_EQ(second->ptr(1).get(), first->ptr(0).get());
  EXPECT_EQ(model.named_children()["second"]->named_children()["1"].get(), first->ptr(0).get());
  repeated->forward(at::randn({4, 16}));
  const auto* layer = repeated->ptr(0)->as<Fp8LinearImpl>();
  EXPECT_EQ(at::count_nonzero(layer->input_scaling.amax_history).item<int64_t>(), 2);  // both calls in FP8
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

// No operator may crash the process on an SDK device. Math-bit views (conjugate, negative, zero
// tensors) through every copy path — which recursed until the stack overflowed — and runaway
// recursion through the device's kernels, which must become a c10::Error naming the operator.
// Each test runs in its own process (gtest_discover_tests), so each may choose emu's memory mode.
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include "error_message.h"

#include <cstdint>
#include <cstdlib>
#include <string>

namespace torchbridge::sdk {
namespace {

using test_support::error_of;

const c10::Device kEmu(c10::DeviceType::PrivateUse1, 0);

// Guarded: every host access goes through runtime copies. Host-addressable: the CPU fallback
// computes in place on device memory. The two take different paths through the glue.
class MathBits : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    setenv("TORCHBRIDGE_EMU_GUARDED", GetParam() ? "1" : "0", 1);
    load_device("emu");
  }
};

at::Tensor complex_input() {
  at::manual_seed(0);
  return at::randn({5, 6, 7}, at::kComplexFloat);
}

void expect_same(const at::Tensor& on_device, const at::Tensor& expected) {
  ASSERT_EQ(on_device.device(), kEmu);
  const at::Tensor host = on_device.cpu();
  EXPECT_TRUE(at::equal(host.resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg()));
}

TEST_P(MathBits, ConjugateViewsCopyCloneAndResolve) {
  const at::Tensor x = complex_input();
  const at::Tensor d = x.to(kEmu);
  const at::Tensor conj = d.conj();
  ASSERT_TRUE(conj.is_conj());  // a lazy view: the bytes are d's
  const at::Tensor expected = x.conj().resolve_conj();
  EXPECT_TRUE(at::equal(conj.cpu(), expected));
  expect_same(conj.clone(), expected);
  expect_same(conj.resolve_conj(), expected);
  EXPECT_FALSE(conj.resolve_conj().is_conj());
  expect_same(conj.contiguous(), expected);
  // A strided conjugate view (the staging path rather than raw bytes).
  expect_same(conj.slice(1, 0, 6, 2).clone(), expected.slice(1, 0, 6, 2));
  // To another dtype, and between the two emu devices.
  EXPECT_TRUE(at::equal(conj.to(at::kComplexDouble).cpu(), expected.to(at::kComplexDouble)));
  const at::Tensor on_second = conj.to(c10::Device(c10::DeviceType::PrivateUse1, 1));
  EXPECT_TRUE(at::equal(on_second.cpu(), expected));
}

TEST_P(MathBits, NegativeViewsCopyCloneAndResolve) {
  const at::Tensor x = complex_input();
  const at::Tensor d = x.to(kEmu);
  const at::Tensor neg = at::_neg_view(d);
  ASSERT_TRUE(neg.is_neg());
  EXPECT_TRUE(at::equal(neg.cpu(), -x));
  expect_same(neg.clone(), -x);
  expect_same(neg.resolve_neg(), -x);
  // conj().imag() is a negative view of a real tensor; both bits together on a complex one.
  const at::Tensor imag = at::imag(d.conj());
  ASSERT_TRUE(imag.is_neg());
  expect_same(imag.clone(), -at::imag(x));
  const at::Tensor both = at::_neg_view(d.conj());
  ASSERT_TRUE(both.is_conj() && both.is_neg());
  expect_same(both.clone(), -x.conj());
  // Real dtypes have negative views too.
  const at::Tensor r = at::randn({4, 3});
  expect_same(at::_neg_view(r.to(kEmu)).t().clone(), -r.t());
}

TEST_P(MathBits, CopiesIntoMathBitViewsWriteTheRightBytes) {
  const at::Tensor x = complex_input();
  const at::Tensor d = x.to(kEmu);
  // device -> device, host -> device, into a dense and into a strided conjugate view
  at::Tensor target = at::zeros_like(d);
  target.conj().copy_(d);
  expect_same(target, x.conj());
  target = at::zeros_like(d);
  target.conj().copy_(x);
  expect_same(target, x.conj());
  target = at::zeros_like(d);
  target.conj().slice(1, 0, 6, 2).copy_(d.slice(1, 0, 6, 2));
  expect_same(target.slice(1, 0, 6, 2), x.conj().slice(1, 0, 6, 2));
  expect_same(target.slice(1, 1, 6, 2), at::zeros({5, 3, 7}, at::kComplexFloat));  // the holes kept their bytes
  // Differing bits on both sides: a negative view receives a conjugate view.
  target = at::zeros_like(d);
  at::_neg_view(target).copy_(d.conj());
  expect_same(target, -x.conj());
  // device -> host into a CPU conjugate view, and a conjugate source into a plain host tensor.
  at::Tensor host = at::zeros_like(x);
  host.conj().copy_(d);
  EXPECT_TRUE(at::equal(host, x.conj().resolve_conj()));
  host = at::zeros_like(x);
  host.copy_(d.conj());
  EXPECT_TRUE(at::equal(host, x.conj().resolve_conj()));
  // An in-place operator on a conjugate view (the conjugate fallback copies the result back).
  target = d.clone();
  target.conj().mul_(2);
  expect_same(target, x * 2);
}

// torch lets mm, dot, vdot, ... through the Conjugate key (BLAS conjugates by itself), so the CPU
// fallback receives conjugate views; the host-addressable path once handed the kernel their plain
// bytes (wrong results: found by the OpInfo sweep through householder_product's gradient).
TEST_P(MathBits, OperatorsThatTakeConjugateViewsDirectly) {
  const at::Tensor a = complex_input().select(0, 0), b = complex_input().select(0, 1).t();
  const at::Tensor da = a.to(kEmu), db = b.to(kEmu);
  EXPECT_TRUE(at::allclose(at::mm(da.conj(), db).cpu(), at::mm(a.conj(), b)));
  EXPECT_TRUE(at::allclose(at::mm(da, db.conj()).cpu(), at::mm(a, b.conj())));
  EXPECT_TRUE(at::allclose(at::mm(at::_neg_view(da), db).cpu(), at::mm(-a, b)));
  const at::Tensor u = a.select(0, 0), v = a.select(0, 1);
  EXPECT_TRUE(at::allclose(at::dot(u.to(kEmu).conj(), v.to(kEmu)).cpu(), at::dot(u.conj(), v)));
  EXPECT_TRUE(at::allclose(at::vdot(u.to(kEmu), v.to(kEmu).conj()).cpu(), at::vdot(u, v.conj())));
}

// A kernel may leave its output a conjugate view: linalg_lu_solve with left=False solves for X^H
// and hands back its conjugate. The host-addressable fallback wrote such an output back as raw
// bytes, dropping the bit (a conjugated answer; found by the OpInfo sweep).
TEST_P(MathBits, OutputsAKernelLeavesConjugatedAreResolved) {
  at::manual_seed(0);
  const at::Tensor a = at::randn({3, 3}, at::kComplexFloat), b = at::randn({4, 3}, at::kComplexFloat);
  const auto [lu, pivots] = at::linalg_lu_factor(a);
  const at::Tensor expected = at::linalg_lu_solve(lu, pivots, b, /*left=*/false);
  const at::Tensor actual = at::linalg_lu_solve(lu.to(kEmu), pivots.to(kEmu), b.to(kEmu), /*left=*/false);
  EXPECT_TRUE(at::allclose(actual.cpu(), expected, 1e-5, 1e-6));
}

TEST_P(MathBits, ZeroTensors) {
  const at::Tensor zero = at::_efficientzerotensor({3, 4}, at::TensorOptions().device(kEmu));
  expect_same(zero, at::zeros({3, 4}));
  const at::Tensor x = at::randn({3, 4});
  expect_same(zero + x.to(kEmu), x);
  at::Tensor target = x.to(kEmu);
  target.copy_(zero);
  expect_same(target, at::zeros({3, 4}));
}

// The reproduction: every FFT whose kernels conjugate, forward and backward.
TEST_P(MathBits, FftsAndComplexAutogradMatchTheCpu) {
  const at::Tensor x = complex_input();
  const at::Tensor real = at::randn({5, 6, 7});
  const auto compare = [](const at::Tensor& device_result, const at::Tensor& cpu_result) {
    ASSERT_EQ(device_result.device(), kEmu);
    EXPECT_TRUE(at::allclose(device_result.cpu(), cpu_result, 1e-5, 1e-5));
  };
  compare(at::fft_hfft(x.to(kEmu)), at::fft_hfft(x));
  compare(at::fft_hfft2(x.to(kEmu)), at::fft_hfft2(x));
  compare(at::fft_hfftn(x.to(kEmu)), at::fft_hfftn(x));
  compare(at::fft_ifft(x.to(kEmu)), at::fft_ifft(x));
  compare(at::fft_ihfft(real.to(kEmu)), at::fft_ihfft(real));
  compare(at::fft_ihfftn(real.to(kEmu)), at::fft_ihfftn(real));
  // Gradients through conjugation and through the c2r backward, which scales a strided view in
  // place (that write-back once re-laid the view out contiguously: wrong gradients).
  const auto gradient = [&](const c10::Device& device) {
    const at::Tensor leaf = x.to(device).detach().requires_grad_();
    at::fft_hfft(leaf * leaf.conj() + leaf).abs().sum().backward();
    return leaf.grad().cpu();
  };
  EXPECT_TRUE(at::allclose(gradient(kEmu), gradient(at::kCPU), 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(EmuModes, MathBits, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "guarded" : "host_addressable";
                         });

// ---- Runaway recursion ---------------------------------------------------------------------------

// Deliberately broken operators, for the guard to stop. `again` has only a CPU kernel, which sends
// its input back to the device and calls itself: every call re-enters the CPU fallback.
// `loop_on_device` has a device kernel that clones and calls itself: it never reaches the
// fallback, only the native allocation and copy kernels.
TORCH_LIBRARY(tb_recursion_test, m) {
  m.def("again(Tensor x) -> Tensor");
  m.def("loop_on_device(Tensor x) -> Tensor");
}

at::Tensor call_test_op(const char* name, const at::Tensor& x) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .typed<at::Tensor(const at::Tensor&)>()
      .call(x);
}

at::Tensor again_cpu(const at::Tensor& x) { return call_test_op("tb_recursion_test::again", x.to(kEmu)); }
at::Tensor loop_on_device(const at::Tensor& x) { return call_test_op("tb_recursion_test::loop_on_device", x.clone()); }

TORCH_LIBRARY_IMPL(tb_recursion_test, CPU, m) { m.impl("again", again_cpu); }
TORCH_LIBRARY_IMPL(tb_recursion_test, PrivateUse1, m) { m.impl("loop_on_device", loop_on_device); }

TEST(SdkRecursion, RunawayRecursionThroughTheFallbackIsAnErrorNamingTheOperator) {
  load_device("emu");
  const at::Tensor x = at::ones({4}, at::TensorOptions().device(kEmu));
  const std::string message = error_of([&] { call_test_op("tb_recursion_test::again", x); });
  RecordProperty("message", message);
  EXPECT_NE(message.find("operator tb_recursion_test::again on device 'emu'"), std::string::npos) << message;
  EXPECT_NE(message.find("runaway recursion"), std::string::npos) << message;
  EXPECT_NE(message.find("nested 32 deep"), std::string::npos) << message;
  // The process, the device and the fallback all still work.
  EXPECT_TRUE(at::equal((x * 2).cpu(), at::full({4}, 2.0f)));
}

TEST(SdkRecursion, RunawayRecursionOutsideTheFallbackStopsBeforeTheStackOverflows) {
  load_device("emu");
  const at::Tensor x = at::ones({4}, at::TensorOptions().device(kEmu));
  const std::string message = error_of([&] { call_test_op("tb_recursion_test::loop_on_device", x); });
  RecordProperty("message", message);
  EXPECT_NE(message.find("on device 'emu' stopped: runaway recursion has used this thread's stack"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("operator aten::"), std::string::npos) << message;  // where it was caught
  EXPECT_TRUE(at::equal((x * 2).cpu(), at::full({4}, 2.0f)));
}

}  // namespace
}  // namespace torchbridge::sdk

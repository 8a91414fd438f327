// Sparse layouts on an SDK device, against the same computation on the CPU: COO and the compressed
// layouts (CSR, CSC, BSR) live on the device, convert, multiply, and take gradients; computation is
// counted as CPU fallback and strict mode refuses it naming the operator. Quantized tensors are
// refused with a clear error. Each test runs in its own process and picks emu's memory mode.
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "error_message.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

namespace torchbridge::sdk {
namespace {

using test_support::error_of;

const c10::Device kEmu(c10::DeviceType::PrivateUse1, 0);

class Sparse : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    setenv("TORCHBRIDGE_EMU_GUARDED", GetParam() ? "1" : "0", 1);
    load_device("emu");
  }
};

// A matrix with about half its entries zero.
at::Tensor sparse_matrix(int64_t rows, int64_t cols) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({rows, cols});
  return x * (x.abs() > 0.7);
}

void expect_on_device_like(const at::Tensor& on_device, const at::Tensor& expected) {
  ASSERT_EQ(on_device.device(), kEmu);
  ASSERT_EQ(on_device.layout(), expected.layout());
  const at::Tensor host = on_device.cpu();
  EXPECT_TRUE(at::allclose(host.layout() == c10::kStrided ? host : host.to_dense(),
                           expected.layout() == c10::kStrided ? expected : expected.to_dense(), 1e-5, 1e-6));
}

TEST_P(Sparse, CooTensorsLiveOnTheDevice) {
  const at::Tensor x = sparse_matrix(6, 5);
  const at::Tensor coo = x.to(kEmu).to_sparse();
  ASSERT_EQ(coo.layout(), c10::kSparse);
  EXPECT_EQ(coo._indices().device(), kEmu);  // the members are device tensors
  EXPECT_EQ(coo._values().device(), kEmu);
  EXPECT_EQ(coo._nnz(), x.to_sparse()._nnz());
  expect_on_device_like(coo, x.to_sparse());
  expect_on_device_like(coo.to_dense(), x);
  expect_on_device_like(coo.coalesce(), x.to_sparse().coalesce());
  expect_on_device_like(coo.clone(), x.to_sparse());
  expect_on_device_like(coo.t(), x.t().to_sparse());
  // Built from device indices and values, and moved from the CPU.
  const at::Tensor indices = at::tensor({0, 2, 1, 3}, at::kLong).view({2, 2});
  const at::Tensor values = at::tensor({1.5f, -2.0f});
  const at::Tensor built = at::sparse_coo_tensor(indices.to(kEmu), values.to(kEmu), {3, 4});
  expect_on_device_like(built, at::sparse_coo_tensor(indices, values, {3, 4}));
  expect_on_device_like(x.to_sparse().to(kEmu), x.to_sparse());
}

TEST_P(Sparse, CooArithmeticAndProductsMatchTheCpu) {
  const at::Tensor x = sparse_matrix(6, 5), y = sparse_matrix(6, 5).flip(0);
  const at::Tensor d = at::randn({5, 3});
  const at::Tensor sx = x.to(kEmu).to_sparse(), sy = y.to(kEmu).to_sparse();
  expect_on_device_like(sx + sy, x.to_sparse() + y.to_sparse());
  expect_on_device_like(sx * 3, x.to_sparse() * 3);
  expect_on_device_like(at::mm(sx, d.to(kEmu)), at::mm(x.to_sparse(), d));
  expect_on_device_like(at::_sparse_sum(sx), at::_sparse_sum(x.to_sparse()));
  expect_on_device_like(at::_sparse_softmax(sx, 1, false), at::_sparse_softmax(x.to_sparse(), 1, false));
}

TEST_P(Sparse, CompressedLayoutsLiveOnTheDeviceAndMultiply) {
  const at::Tensor x = sparse_matrix(6, 4);
  const at::Tensor d = at::randn({4, 3});
  const at::Tensor csr = x.to(kEmu).to_sparse_csr();
  ASSERT_EQ(csr.layout(), c10::kSparseCsr);
  EXPECT_EQ(csr.crow_indices().device(), kEmu);
  EXPECT_TRUE(at::equal(csr.col_indices().cpu(), x.to_sparse_csr().col_indices()));
  EXPECT_TRUE(at::equal(csr.values().cpu(), x.to_sparse_csr().values()));
  expect_on_device_like(csr.to_dense(), x);
  expect_on_device_like(csr.clone(), x.to_sparse_csr());
  expect_on_device_like(x.to(kEmu).to_sparse_csc(), x.to_sparse_csc());
  expect_on_device_like(x.to(kEmu).to_sparse_bsr({2, 2}), x.to_sparse_bsr({2, 2}));
  expect_on_device_like(at::mm(csr, d.to(kEmu)), at::mm(x.to_sparse_csr(), d));
  // sampled_addmm computes mat1 @ mat2 only where the CSR input has entries.
  const at::Tensor a = at::randn({6, 2}), b = at::randn({2, 4});
  expect_on_device_like(at::sparse_sampled_addmm(csr, a.to(kEmu), b.to(kEmu), 0.5, 2.0),
                        at::sparse_sampled_addmm(x.to_sparse_csr(), a, b, 0.5, 2.0));
}

TEST_P(Sparse, GradientsThroughSparseProductsMatchTheCpu) {
  const at::Tensor x = sparse_matrix(6, 5);
  const at::Tensor w = at::randn({5, 3});
  const auto gradient = [&](const c10::Device& device) {
    const at::Tensor leaf = w.to(device).detach().requires_grad_();
    at::mm(x.to(device).to_sparse(), leaf).tanh().sum().backward();
    return leaf.grad().cpu();
  };
  EXPECT_TRUE(at::allclose(gradient(kEmu), gradient(at::kCPU), 1e-5, 1e-6));
  // sparse.mm with an amax/amin reduction keeps the argmax for the backward only when its dense
  // input requires grad: the CPU copies must say so (without it the backward crashed).
  const at::Tensor csr = x.to_sparse_csr();
  const auto reduced_gradient = [&](const c10::Device& device) {
    const at::Tensor leaf = w.to(device).detach().requires_grad_();
    std::get<0>(at::_sparse_mm_reduce_impl(csr.to(device), leaf, "amax")).sum().backward();
    return leaf.grad().cpu();
  };
  EXPECT_TRUE(at::allclose(reduced_gradient(kEmu), reduced_gradient(at::kCPU)));
}

TEST_P(Sparse, SparseComputationIsCountedAndStrictModeRefusesIt) {
  const at::Tensor coo = sparse_matrix(4, 4).to(kEmu).to_sparse();
  reset_fallback_counts();
  (void)(coo * 2);
  EXPECT_GE(fallback_counts()["aten::mul.Tensor"], 1);
  setenv(kStrictEnvVar, "1", 1);
  const std::string message = error_of([&] { (void)(coo * 2); });
  unsetenv(kStrictEnvVar);
  EXPECT_NE(message.find("operator aten::mul.Tensor has no native kernel for device 'emu'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("TORCHBRIDGE_SDK_STRICT=1"), std::string::npos) << message;
  EXPECT_NE(message.find("fallback_counts()"), std::string::npos) << message;  // the way out
  EXPECT_EQ(coo._nnz(), sparse_matrix(4, 4).to_sparse()._nnz()) << "structure queries are native, not refused";
}

TEST_P(Sparse, QuantizedTensorsAreAClearError) {
  const std::string message = error_of([] {
    (void)at::quantize_per_tensor(at::randn({3}).to(kEmu), 0.1, 0, at::kQInt8);
  });
  EXPECT_NE(message.find("on device 'emu': quantized tensors are not supported"), std::string::npos) << message;
  EXPECT_NE(message.find("dequantize()"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(EmuModes, Sparse, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "guarded" : "host_addressable";
                         });

}  // namespace
}  // namespace torchbridge::sdk

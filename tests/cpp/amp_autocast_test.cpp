// AutocastScope on the CPU and on emu (an SDK device): the dtype operators run in inside, nesting,
// restoration after an exception, and the cast cache's lifetime. References: ATen's own autocast
// state queries and at::autocast::cached_cast, which the dispatcher's autocast kernels use.
#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "error_message.h"

#include <optional>
#include <stdexcept>
#include <string>

namespace torchbridge::amp {
namespace {

using test_support::error_of;

class AutocastScopeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "emu") sdk::load_device("emu");
  }
  c10::Device device() const { return GetParam() == "emu" ? c10::Device("emu:0") : c10::Device(c10::kCPU); }
  c10::DeviceType type() const { return device().type(); }
  at::Tensor randn(bool requires_grad = false) const {
    return at::randn({4, 4}, at::TensorOptions().device(device())).set_requires_grad(requires_grad);
  }
};

TEST_P(AutocastScopeTest, OperatorsRunInTheScopesDtypeInsideAndFloatOutside) {
  const at::Tensor a = randn(), b = randn();
  const bool enabled_before = at::autocast::is_autocast_enabled(type());
  {
    AutocastScope scope(GetParam(), {.dtype = at::kBFloat16});
    EXPECT_TRUE(at::autocast::is_autocast_enabled(type()));
    const at::Tensor product = at::matmul(a, b);
    EXPECT_EQ(product.scalar_type(), at::kBFloat16);
    EXPECT_EQ(product.device(), device());
    // The product autocast computed equals the product of the bfloat16 casts outside autocast.
    at::Tensor expected;
    {
      AutocastScope off(type(), {.enabled = false});
      expected = at::matmul(a.to(at::kBFloat16), b.to(at::kBFloat16));
    }
    EXPECT_TRUE(at::equal(product.cpu(), expected.cpu()));
  }
  EXPECT_EQ(at::autocast::is_autocast_enabled(type()), enabled_before);
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
}

TEST_P(AutocastScopeTest, ScopesNestAndEachRestoresWhatItFound) {
  const at::Tensor a = randn(), b = randn();
  const at::ScalarType dtype_before = at::autocast::get_autocast_dtype(type());
  {
    AutocastScope outer(type(), {.dtype = at::kBFloat16});
    {
      AutocastScope inner(type(), {.dtype = at::kHalf});
      EXPECT_EQ(at::autocast::get_autocast_dtype(type()), at::kHalf);
      {
        AutocastScope off(type(), {.enabled = false});
        EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
      }
      EXPECT_TRUE(at::autocast::is_autocast_enabled(type()));
    }
    EXPECT_EQ(at::autocast::get_autocast_dtype(type()), at::kBFloat16);
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(type()));
  EXPECT_EQ(at::autocast::get_autocast_dtype(type()), dtype_before);
}

TEST_P(AutocastScopeTest, AnExceptionLeavingTheScopeRestoresTheState) {
  const at::ScalarType dtype_before = at::autocast::get_autocast_dtype(type());
  try {
    AutocastScope outer(type(), {.dtype = at::kBFloat16, .cache_enabled = true});
    AutocastScope inner(type(), {.dtype = at::kHalf, .cache_enabled = false});
    throw std::runtime_error("training step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(type()));
  EXPECT_EQ(at::autocast::get_autocast_dtype(type()), dtype_before);
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  // Both scopes released their nesting level: the next increment is the outermost again.
  EXPECT_EQ(at::autocast::increment_nesting(), 1);
  EXPECT_EQ(at::autocast::decrement_nesting(), 0);
}

TEST_P(AutocastScopeTest, WeightCastsAreCachedUntilTheOutermostScopeCloses) {
  const at::Tensor weight = randn(/*requires_grad=*/true);  // a leaf that requires grad: cacheable
  at::Tensor first;
  {
    AutocastScope outer(type(), {.dtype = at::kBFloat16});
    first = at::autocast::cached_cast(at::kBFloat16, weight, type());
    EXPECT_EQ(first.scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::autocast::cached_cast(at::kBFloat16, weight, type()).unsafeGetTensorImpl(),
              first.unsafeGetTensorImpl());
    {
      AutocastScope inner(type(), {.dtype = at::kBFloat16});
    }
    // Closing an inner scope keeps the cache.
    EXPECT_EQ(at::autocast::cached_cast(at::kBFloat16, weight, type()).unsafeGetTensorImpl(),
              first.unsafeGetTensorImpl());
  }
  AutocastScope again(type(), {.dtype = at::kBFloat16});
  // `first` is still alive, so a new cast at a different address proves the cache was cleared.
  EXPECT_NE(at::autocast::cached_cast(at::kBFloat16, weight, type()).unsafeGetTensorImpl(),
            first.unsafeGetTensorImpl());
}

TEST_P(AutocastScopeTest, CacheCanBeTurnedOffForAScope) {
  const at::Tensor weight = randn(/*requires_grad=*/true);
  AutocastScope scope(type(), {.dtype = at::kBFloat16, .cache_enabled = false});
  EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
  const at::Tensor first = at::autocast::cached_cast(at::kBFloat16, weight, type());
  EXPECT_NE(at::autocast::cached_cast(at::kBFloat16, weight, type()).unsafeGetTensorImpl(),
            first.unsafeGetTensorImpl());
}

TEST_P(AutocastScopeTest, ANonFloatingDtypeIsRefusedAndChangesNothing) {
  const std::string message = error_of([this] { AutocastScope scope(type(), {.dtype = at::kInt}); });
  EXPECT_NE(message.find("dtype Int is not a floating-point type"), std::string::npos) << message;
  EXPECT_FALSE(at::autocast::is_autocast_enabled(type()));
  EXPECT_EQ(at::autocast::increment_nesting(), 1);
  EXPECT_EQ(at::autocast::decrement_nesting(), 0);
}

// torch.autocast("cpu", dtype=torch.float64) warns and leaves autocast off (its matmul stays
// float32); the scope turned it on and computed matmuls in float64.
TEST_P(AutocastScopeTest, ADtypeAutocastDoesNotTakeWarnsAndLeavesItOffAsTorchDoes) {
  const at::Tensor a = randn(), b = randn();
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    ::testing::internal::CaptureStderr();
    {
      AutocastScope scope(type(), {.dtype = dtype});
      EXPECT_FALSE(at::autocast::is_autocast_enabled(type())) << c10::toString(dtype);
      EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
    }
    const std::string warned = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(warned.find("supports Half and BFloat16, not " + std::string(c10::toString(dtype))), std::string::npos)
        << warned;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, AutocastScopeTest, ::testing::Values("cpu", "emu"));

TEST(AutocastScope, AnUnknownDeviceNameIsRefusedByName) {
  const std::string message = error_of([] { AutocastScope scope(std::string("warpdrive")); });
  EXPECT_NE(message.find("unknown device type 'warpdrive'"), std::string::npos) << message;
}

// torch.autocast("cuda") on a CPU-only torch warns and stays off; the scope turned CUDA autocast on.
// XPU: a device type with an autocast key that neither this machine nor the GPU machines have.
TEST(AutocastScope, ADeviceTypeWithoutADeviceWarnsAndStaysOffAsTorchDoes) {
  ::testing::internal::CaptureStderr();
  {
    AutocastScope scope(c10::DeviceType::XPU, {.dtype = at::kBFloat16});
    EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::DeviceType::XPU));
  }
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("device type 'xpu' has no device in this process; autocast is disabled"), std::string::npos)
      << warned;
}

TEST(AutocastScope, CpuDefaultsToBfloat16AsTorchDoes) {
  AutocastScope scope(c10::kCPU);
  EXPECT_EQ(scope.dtype(), at::kBFloat16);
}

}  // namespace
}  // namespace torchbridge::amp

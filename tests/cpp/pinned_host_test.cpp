// pinned_host_like against what the device's own runtime calls pinned (the SDK's hooks, asked
// through torch's Context), with the layout empty_like would give, and the premise it works around:
// on a machine with CUDA, torch's pinned_memory(true) pins for CUDA even when an SDK device is the
// process's accelerator. Bad device types raise naming them.
#include <torchbridge/pinned_host.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "expect_error.h"

#include <cstdint>
#include <string>

namespace torchbridge {
namespace {

using test_support::expect_error;

class PinnedHostTest : public ::testing::Test {
 protected:
  void SetUp() override { sdk::load_device("emu"); }
};

bool pinned_for_sdk_device(const at::Tensor& host) {
  return at::globalContext().isPinnedPtr(host.data_ptr(), c10::DeviceType::PrivateUse1);
}

TEST_F(PinnedHostTest, IsTheDeviceTypesPinnedMemoryWithEmptyLikesLayout) {
  const at::Tensor transposed = at::randn({4, 6}).to(c10::Device("emu:0")).t();  // dense, not contiguous
  const at::Tensor host = pinned_host_like(transposed, c10::DeviceType::PrivateUse1);
  EXPECT_TRUE(host.is_cpu());
  EXPECT_TRUE(pinned_for_sdk_device(host));
  EXPECT_EQ(host.scalar_type(), transposed.scalar_type());
  EXPECT_EQ(host.sizes(), transposed.sizes());
  EXPECT_EQ(host.strides(), transposed.strides());  // as empty_like keeps them: copies move raw bytes

  const at::Tensor strided = at::zeros({8, 6}, at::kDouble).to(c10::Device("emu:0")).slice(0, 0, 8, 2);  // holes
  const at::Tensor dense_host = pinned_host_like(strided, c10::DeviceType::PrivateUse1);
  EXPECT_TRUE(pinned_for_sdk_device(dense_host));
  EXPECT_EQ(dense_host.scalar_type(), at::kDouble);
  EXPECT_EQ(dense_host.sizes(), strided.sizes());
  EXPECT_TRUE(dense_host.is_contiguous());

  // The memory is usable both ways, through the device's pinned copy path.
  const at::Tensor source = at::arange(24, at::kFloat).reshape({4, 6}).to(c10::Device("emu:0")).t();
  at::Tensor back = pinned_host_like(source, c10::DeviceType::PrivateUse1);
  back.copy_(source, /*non_blocking=*/true);
  at::Tensor on_device = at::empty_like(source);
  on_device.copy_(back, /*non_blocking=*/true);
  EXPECT_TRUE(at::equal(on_device.cpu(), at::arange(24, at::kFloat).reshape({4, 6}).t()));
}

TEST_F(PinnedHostTest, TorchsOwnPinnedMemoryIsCudasWhereTheMachineHasCuda) {
  const at::Tensor torchs = at::empty({16}, at::TensorOptions().pinned_memory(true));
  if (at::globalContext().hasCUDA()) {
    // Why pinned_host.h exists: if this starts to fail, torch pins for the accelerator again.
    EXPECT_FALSE(pinned_for_sdk_device(torchs)) << "torch's pinned_memory(true) pinned for the SDK device";
  } else {
    EXPECT_TRUE(pinned_for_sdk_device(torchs)) << "without CUDA, torch pins for the process's accelerator";
  }
  EXPECT_TRUE(pinned_for_sdk_device(pinned_host_like(torchs, c10::DeviceType::PrivateUse1)));
}

TEST_F(PinnedHostTest, DeviceTypesWithoutPinnedMemoryAreRefusedNamingThem) {
  const at::Tensor like = at::zeros({2});
  expect_error([&] { pinned_host_like(like, c10::DeviceType::Meta); }, "meta is not an accelerator");
  expect_error([&] { pinned_host_like(like, c10::DeviceType::CPU); }, "cpu is not an accelerator");
  expect_error([&] { pinned_host_like(at::Tensor(), c10::DeviceType::PrivateUse1); }, "an undefined tensor");
  if (!at::globalContext().hasCUDA()) {  // a torch without CUDA, or no driver
    expect_error([&] { pinned_host_like(like, c10::DeviceType::CUDA); }, "torch has no pinned host memory for cuda");
  }
}

}  // namespace
}  // namespace torchbridge

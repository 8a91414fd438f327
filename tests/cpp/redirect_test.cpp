// The device-redirection policy shared by C++ programs and the Python package.
#include <torchbridge/redirect.h>
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <memory>

namespace torchbridge {
namespace {

bool cuda_here() { return BackendRegistry::instance().lookup("cuda")->is_available(); }

TEST(Redirect, MissingAcceleratorsGoToTheTarget) {
  if (cuda_here()) GTEST_SKIP() << "CUDA is available, so cuda requests stay";
  const DeviceResolution r = resolve_device("cuda:0", "cpu");
  EXPECT_EQ(r.device, c10::Device(c10::kCPU));
  EXPECT_TRUE(r.redirected);
  EXPECT_EQ(resolve_device("mps", "cpu").device, c10::Device(c10::kCPU));
  EXPECT_EQ(resolve_device("xpu:3", "cpu").device, c10::Device(c10::kCPU));
}

TEST(Redirect, CpuStaysAndCpuMinusOneForcesTheCpu) {
  const DeviceResolution cpu = resolve_device("cpu", "cpu");
  EXPECT_EQ(cpu.device, c10::Device(c10::kCPU));
  EXPECT_FALSE(cpu.redirected);
  const DeviceResolution forced = resolve_device("cpu:-1", "emu");
  EXPECT_EQ(forced.device, c10::Device(c10::kCPU));
  EXPECT_TRUE(forced.redirected);
}

TEST(Redirect, MetaAndLazyAreNotAccelerators) {
  EXPECT_EQ(resolve_device("meta", "cpu").device, c10::Device(c10::DeviceType::Meta));
  EXPECT_FALSE(resolve_device("meta", "cpu").redirected);
  EXPECT_EQ(resolve_device("lazy", "cpu").device.type(), c10::DeviceType::Lazy);
}

TEST(Redirect, IndicesWrapModuloTheTargetsDeviceCount) {
  if (cuda_here()) GTEST_SKIP() << "CUDA is available, so cuda requests stay";
  const DeviceResolution r = resolve_device("cuda:3", "emu");  // emu has 2 devices
  EXPECT_EQ(r.device, c10::Device(c10::DeviceType::PrivateUse1, 1));
  EXPECT_TRUE(r.index_wrapped);
  EXPECT_EQ(resolve_device("cuda", "emu").device, c10::Device(c10::DeviceType::PrivateUse1));
  // With a detected target, a device this process has stays, its index wrapped.
  const DeviceResolution own = resolve_device("emu:2", "cpu", RedirectTarget::kDetected);
  EXPECT_EQ(own.device, c10::Device(c10::DeviceType::PrivateUse1, 0));
  EXPECT_TRUE(own.index_wrapped);
  EXPECT_TRUE(own.redirected);
}

// A target the user named takes every accelerator request, including devices this process has:
// TORCHBRIDGE_BACKEND=cpu on a machine with emu (or CUDA) means the CPU.
TEST(Redirect, AnExplicitTargetTakesRequestsForDevicesThatExist) {
  if (cuda_here()) GTEST_SKIP() << "the CUDA variant of this test covers a GPU machine";
  create_backend("emu");
  const DeviceResolution to_cpu = resolve_device("emu:1", "cpu");
  EXPECT_EQ(to_cpu.device, c10::Device(c10::kCPU));
  EXPECT_TRUE(to_cpu.redirected);
  const DeviceResolution same = resolve_device("emu:1", "emu");  // already the target: not redirected
  EXPECT_EQ(same.device, c10::Device(c10::DeviceType::PrivateUse1, 1));
  EXPECT_FALSE(same.redirected);
}

TEST(Redirect, AnExplicitTargetTakesCudaRequestsOnAGpuMachine) {
  if (!cuda_here()) GTEST_SKIP() << "needs a CUDA device";
  const DeviceResolution to_cpu = resolve_device("cuda:0", "cpu");
  EXPECT_EQ(to_cpu.device, c10::Device(c10::kCPU));
  EXPECT_TRUE(to_cpu.redirected);
  const DeviceResolution detected = resolve_device("cuda:0", "cpu", RedirectTarget::kDetected);
  EXPECT_EQ(detected.device, c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_FALSE(detected.redirected);
}

TEST(Redirect, BadRequestsAndTargetsAreErrors) {
  EXPECT_THROW(resolve_device("warp:0", "cpu"), c10::ValueError);
  if (!cuda_here()) {
    EXPECT_THROW(resolve_device("cuda", "bogus"), c10::ValueError);
  }
}

}  // namespace
}  // namespace torchbridge

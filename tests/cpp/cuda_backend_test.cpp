// NVIDIA adapter. Without a GPU these tests skip with the reason; the availability verdict is
// still checked against torch's own view.
#include "backends/cuda_driver.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>
#include <torchbridge/validation/validator.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#ifdef TORCHBRIDGE_HAVE_CUDA_H
#include <cuda.h>
static_assert(torchbridge::cuda_driver::kAttrMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(torchbridge::cuda_driver::kAttrIntegrated == CU_DEVICE_ATTRIBUTE_INTEGRATED);
static_assert(torchbridge::cuda_driver::kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(torchbridge::cuda_driver::kAttrComputeCapabilityMinor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(torchbridge::cuda_driver::kAttrPageableMemoryAccess == CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
static_assert(torchbridge::cuda_driver::kCudaErrorNoDevice == CUDA_ERROR_NO_DEVICE);
#endif

namespace torchbridge {
namespace {

std::shared_ptr<Backend> cuda() { return BackendRegistry::instance().lookup("cuda"); }

TEST(CudaBackend, AvailabilityAgreesWithTorch) {
  const Availability a = cuda()->availability();
  EXPECT_EQ(a.available(), at::hasCUDA() && !at::detail::getCUDAHooks().hasROCM());
  if (!at::detail::getCUDAHooks().isBuilt()) {
    EXPECT_EQ(a.status, AvailabilityStatus::kNotCompiled);
    EXPECT_NE(a.reason.find("not compiled into this torch build"), std::string::npos);
  }
}

TEST(CudaBackend, VersionFormatting) {
  EXPECT_EQ(cuda_driver::format_cuda_version(12080), "12.8");
  EXPECT_EQ(cuda_driver::format_cuda_version(13000), "13.0");
  EXPECT_EQ(cuda_driver::format_cuda_version(0), "");
}

TEST(CudaBackend, DescribesRealGpus) {
  if (!cuda()->is_available()) GTEST_SKIP() << "no NVIDIA GPU: " << cuda()->availability().reason;
  const DeviceInfo info = cuda()->info(0);
  EXPECT_EQ(info.vendor, "NVIDIA");
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(info.architecture.rfind("sm_", 0), 0u);
  ASSERT_TRUE(info.total_memory_bytes && info.free_memory_bytes);
  EXPECT_LE(*info.free_memory_bytes, *info.total_memory_bytes);
  EXPECT_GT(info.multiprocessor_count.value_or(0), 0);
  EXPECT_FALSE(info.driver_version.empty());
}

TEST(CudaBackend, MemoryStatsMoveWithAllocations) {
  if (!cuda()->is_available()) GTEST_SKIP() << "no NVIDIA GPU: " << cuda()->availability().reason;
  auto backend = cuda();
  const int64_t before = *backend->memory_stats(0).allocated_bytes;
  {
    at::Tensor t = at::empty({64 << 20}, at::TensorOptions().dtype(at::kByte).device(backend->device(0)));
    const MemoryStats during = backend->memory_stats(0);
    EXPECT_EQ(*during.allocated_bytes - before, 64 << 20);
    EXPECT_GE(*during.peak_allocated_bytes, *during.allocated_bytes);
    EXPECT_GE(*during.reserved_bytes, *during.allocated_bytes);
  }
  EXPECT_EQ(*backend->memory_stats(0).allocated_bytes, before);
  backend->empty_cache();
  backend->reset_peak_memory_stats(0);
  EXPECT_EQ(*backend->memory_stats(0).peak_allocated_bytes, before);
}

// CTest runs every test in a fresh process, so this one asks before torch has touched CUDA: torch
// sets up its caching allocator lazily, on the first tensor, and until then answered statistics
// with "invalid device argument".
TEST(CudaBackend, StatisticsAndDescriptionWorkBeforeTheFirstTensor) {
  if (!cuda()->is_available()) GTEST_SKIP() << "no NVIDIA GPU: " << cuda()->availability().reason;
  auto backend = cuda();
  const MemoryStats stats = backend->memory_stats(0);
  EXPECT_EQ(stats.allocated_bytes.value_or(-1), 0);
  EXPECT_TRUE(stats.total_bytes.has_value());
  backend->reset_peak_memory_stats(0);
  backend->empty_cache();
  EXPECT_TRUE(backend->info(0).free_memory_bytes.has_value());
}

// PyTorch's autograd serves one accelerator per process; a registered SDK device would become it
// and every CUDA backward pass would die in an internal assert. Both orders are refused clearly.
TEST(CudaBackend, AnSdkDeviceIsRefusedOnceCudaIsInUse) {
  if (!cuda()->is_available()) GTEST_SKIP() << "no NVIDIA GPU: " << cuda()->availability().reason;
  const at::Tensor on_gpu = at::ones({4}, at::TensorOptions().device(cuda()->device(0)));
  ASSERT_TRUE(native_accelerator_in_use().has_value());
  try {
    sdk::load_device("emu");
    FAIL() << "emu was registered in a process that already uses CUDA";
  } catch (const c10::Error& e) {
    EXPECT_NE(e.msg().find("one accelerator per process"), std::string::npos) << e.msg();
    EXPECT_NE(e.msg().find("cuda (device 0 has a CUDA context)"), std::string::npos) << e.msg();
  }
  EXPECT_FALSE(sdk::registered_device().has_value());
}

TEST(CudaBackend, CudaIsRefusedOnceAnSdkDeviceIsRegistered) {
  if (!cuda()->is_available()) GTEST_SKIP() << "no NVIDIA GPU: " << cuda()->availability().reason;
  sdk::load_device("emu");
  try {
    create_backend("cuda");
    FAIL() << "the cuda backend was handed out in a process that holds emu";
  } catch (const c10::Error& e) {
    EXPECT_NE(e.msg().find("SDK device 'emu' is registered"), std::string::npos) << e.msg();
  }
}

TEST(CudaBackend, StreamsAndTimedEvents) {
  if (!cuda()->is_available()) GTEST_SKIP() << "no NVIDIA GPU: " << cuda()->availability().reason;
  auto backend = cuda();
  const c10::Stream stream = backend->new_stream(0);
  EXPECT_EQ(stream.device(), backend->device(0));
  EXPECT_NE(stream, backend->current_stream(0));
  c10::Event start = backend->new_event(true), stop = backend->new_event(true);
  start.record(stream);
  stop.record(stream);
  stop.synchronize();
  EXPECT_GE(start.elapsedTime(stop), 0.0);
}

}  // namespace
}  // namespace torchbridge

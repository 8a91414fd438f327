// NVIDIA adapter. Without a GPU these tests skip with the reason; the availability verdict is
// still checked against torch's own view.
#include "backends/cuda_driver.h"

#include <torchbridge/registry.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

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

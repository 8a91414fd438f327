// The CPU backend's description and memory statistics, checked against sources independent of
// the code under test: sysconf, sysinfo, getrusage, /proc/self/statm, CPUID and /proc/cpuinfo.
#include <torchbridge/registry.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

std::shared_ptr<Backend> cpu() { return create_backend("cpu"); }

// First value of `key` in /proc/cpuinfo, read with plain string handling.
std::string cpuinfo_value(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0 && line.find(':') != std::string::npos) {
      std::string value = line.substr(line.find(':') + 1);
      return value.empty() ? value : value.substr(value.find_first_not_of(' '));
    }
  }
  return "";
}

int64_t statm_resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  in >> size_pages >> resident_pages;
  return resident_pages * sysconf(_SC_PAGESIZE);
}

TEST(CpuBackend, IsAlwaysAvailableWithOneDevice) {
  EXPECT_TRUE(cpu()->is_available());
  EXPECT_EQ(cpu()->device_count(), 1);
  EXPECT_EQ(cpu()->device(0), c10::Device(c10::kCPU));
}

TEST(CpuBackend, CoreCountsMatchTheOperatingSystem) {
  const DeviceInfo info = cpu()->info(0);
  ASSERT_TRUE(info.cpu.has_value());
  EXPECT_EQ(info.cpu->logical_cores, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(info.cpu->logical_cores, get_nprocs());
  EXPECT_EQ(info.multiprocessor_count, info.cpu->logical_cores);
  const std::string cores_per_package = cpuinfo_value("cpu cores");
  if (cores_per_package.empty()) GTEST_SKIP() << "/proc/cpuinfo has no 'cpu cores' field on this architecture";
  std::set<std::string> packages;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("physical id", 0) == 0) packages.insert(line);
  }
  EXPECT_EQ(info.cpu->physical_cores, std::stoi(cores_per_package) * static_cast<int>(packages.size()));
}

TEST(CpuBackend, ModelNameAndVendorComeFromCpuinfo) {
  const DeviceInfo info = cpu()->info(0);
  const std::string model = cpuinfo_value("model name");
  if (model.empty()) GTEST_SKIP() << "/proc/cpuinfo has no 'model name' on this architecture";
  EXPECT_EQ(info.name, model);
  EXPECT_EQ(info.cpu->model_name, model);
  EXPECT_EQ(info.vendor, cpuinfo_value("vendor_id"));
  EXPECT_EQ(info.backend, "cpu");
}

TEST(CpuBackend, RamMatchesSysinfo) {
  struct sysinfo si {};
  ASSERT_EQ(sysinfo(&si), 0);
  const auto total = static_cast<int64_t>(si.totalram) * si.mem_unit;
  const DeviceInfo info = cpu()->info(0);
  ASSERT_TRUE(info.total_memory_bytes && info.free_memory_bytes);
  EXPECT_NEAR(static_cast<double>(*info.total_memory_bytes), static_cast<double>(total), 4.0 * kMiB);
  EXPECT_EQ(info.cpu->ram_bytes, *info.total_memory_bytes);
  EXPECT_GT(*info.free_memory_bytes, 0u);
  EXPECT_LE(*info.free_memory_bytes, *info.total_memory_bytes);
}

#if defined(__x86_64__)
TEST(CpuBackend, IsaFlagsMatchCpuid) {
  __builtin_cpu_init();
  const CpuIsaFeatures isa = cpu()->info(0).cpu->isa;
  EXPECT_EQ(isa.avx2, __builtin_cpu_supports("avx2") != 0);
  EXPECT_EQ(isa.avx512f, __builtin_cpu_supports("avx512f") != 0);
  EXPECT_EQ(isa.avx512_bf16, __builtin_cpu_supports("avx512bf16") != 0);
}
#endif

TEST(CpuBackend, Bf16AndFp16AreListedOnlyWithHardwareSupport) {
  const DeviceInfo info = cpu()->info(0);
  const auto& isa = info.cpu->isa;
  const bool bf16_hw = isa.avx512_bf16 || isa.amx_bf16 || isa.arm_bf16;
  const bool fp16_hw = isa.avx512_fp16 || isa.amx_fp16 || isa.arm_fp16;
  const auto listed = [&](c10::ScalarType t) {
    return std::find(info.supported_dtypes.begin(), info.supported_dtypes.end(), t) != info.supported_dtypes.end();
  };
  EXPECT_EQ(listed(c10::ScalarType::BFloat16), bf16_hw);
  EXPECT_EQ(listed(c10::ScalarType::Half), fp16_hw);
  EXPECT_EQ(info.features.bf16, bf16_hw);
  EXPECT_TRUE(listed(c10::ScalarType::Float));
  // emu, which computes on the CPU, listed complex numbers while the CPU did not.
  EXPECT_TRUE(listed(c10::ScalarType::ComplexFloat) && listed(c10::ScalarType::ComplexDouble));
  EXPECT_FALSE(listed(c10::ScalarType::Float8_e4m3fn));
  EXPECT_FALSE(info.features.fp8);
  EXPECT_FALSE(info.features.tf32);
}

// As torch prints them without "torch." (str(torch.complex32) etc.): c10's own spelling
// (ComplexHalf, QInt8, UInt16) reached a device's supported dtypes in info and JSON before.
TEST(DtypeNames, AreTorchsNames) {
  const std::vector<std::pair<c10::ScalarType, std::string>> expected = {
      {c10::ScalarType::ComplexHalf, "complex32"},       {c10::ScalarType::QInt8, "qint8"},
      {c10::ScalarType::QUInt4x2, "quint4x2"},           {c10::ScalarType::UInt16, "uint16"},
      {c10::ScalarType::Float8_e8m0fnu, "float8_e8m0fnu"}, {c10::ScalarType::Bits8, "bits8"},
      {c10::ScalarType::BFloat16, "bfloat16"},           {c10::ScalarType::Char, "int8"}};
  for (const auto& [dtype, name] : expected) EXPECT_EQ(dtype_name(dtype), name);
}

TEST(CpuBackend, MemoryStatsMatchProcfsAndGetrusage) {
  const MemoryStats stats = cpu()->memory_stats(0);
  ASSERT_TRUE(stats.allocated_bytes && stats.peak_allocated_bytes && stats.total_bytes && stats.free_bytes);
  EXPECT_NEAR(static_cast<double>(*stats.allocated_bytes), static_cast<double>(statm_resident_bytes()), 2.0 * kMiB);
  struct rusage usage {};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  // Nothing reset the peak yet in this process, so VmHWM equals getrusage's max RSS.
  EXPECT_NEAR(static_cast<double>(*stats.peak_allocated_bytes), usage.ru_maxrss * 1024.0, 2.0 * kMiB);
  // The CPU allocator does not track these; they must be absent, not zero.
  EXPECT_FALSE(stats.reserved_bytes.has_value());
  EXPECT_FALSE(stats.allocation_count.has_value());
  EXPECT_FALSE(stats.out_of_memory_count.has_value());
  EXPECT_NE(stats.source.find("/proc/self/status"), std::string::npos);
}

TEST(CpuBackend, MemoryStatsMoveWithRealAllocationsAndPeakResets) {
  auto backend = cpu();
  const int64_t before = *backend->memory_stats(0).allocated_bytes;
  int64_t during = 0;
  {
    at::Tensor big = at::empty({256 * kMiB}, at::TensorOptions().dtype(at::kByte));
    big.fill_(1);  // touch every page so it becomes resident
    during = *backend->memory_stats(0).allocated_bytes;
    EXPECT_GE(during - before, 200 * kMiB);
    EXPECT_GE(*backend->memory_stats(0).peak_allocated_bytes, during);
  }
  backend->empty_cache();
  const MemoryStats after_free = backend->memory_stats(0);
  EXPECT_LT(*after_free.allocated_bytes, during - 200 * kMiB);
  // The peak remembers. The kernel folds per-thread RSS counters in lazily, so allow 1 MiB slack.
  EXPECT_GE(*after_free.peak_allocated_bytes, during - kMiB);
  backend->reset_peak_memory_stats(0);
  const MemoryStats after_reset = backend->memory_stats(0);
  EXPECT_LT(*after_reset.peak_allocated_bytes, during - 200 * kMiB);
  EXPECT_GE(*after_reset.peak_allocated_bytes, *after_reset.allocated_bytes - kMiB);
}

TEST(CpuBackend, StreamsAndEventsAreHonest) {
  auto backend = cpu();
  const c10::Stream stream = backend->current_stream(0);
  EXPECT_EQ(stream.device(), c10::Device(c10::kCPU));
  EXPECT_EQ(stream.id(), 0);
  EXPECT_THROW(backend->new_stream(0), c10::Error);
  EXPECT_THROW(backend->new_event(true), c10::Error);
  EXPECT_NO_THROW(backend->synchronize(0));
}

}  // namespace
}  // namespace torchbridge

// The CPU as a backend: described from /proc and /sys, measured through the operating system.
#include "backends/adapters.h"
#include "backends/system_probe.h"

#include <c10/util/Exception.h>

#include <malloc.h>
#include <sys/utsname.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::adapters {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  Availability availability() const override { return {AvailabilityStatus::kAvailable, ""}; }
  bool is_real_hardware() const override { return true; }
  int device_count() const override { return 1; }
  // Torch names the host "cpu", without an index; index 0 is the only valid one.
  c10::Device device(int index) const override {
    check_device_index(index);
    return c10::Device(c10::kCPU);
  }

  DeviceInfo info(int index) const override {
    check_device_index(index);
    const system::CpuProcInfo cpu = system::read_cpu();
    const system::SystemMemory memory = system::read_system_memory();

    DeviceInfo info;
    info.backend = name();
    info.index = index;
    info.name = cpu.model_name;
    info.vendor = cpu.vendor;
    info.total_memory_bytes = memory.total_bytes;
    info.free_memory_bytes = memory.available_bytes;
    info.multiprocessor_count = cpu.logical_cores;
    struct utsname uts {};
    if (uname(&uts) == 0) {
      info.architecture = uts.machine;
      info.driver_version = std::string("Linux ") + uts.release;  // the "driver" of a CPU is the kernel
    }

    CpuDetails details;
    details.model_name = cpu.model_name;
    details.physical_cores = cpu.physical_cores;
    details.logical_cores = cpu.logical_cores;
    details.ram_bytes = memory.total_bytes;
    details.isa = system::isa_features_from_flags(cpu.flags);

    using c10::ScalarType;
    // Complex numbers are pairs of float32/float64, which every CPU computes (emu, which computes on
    // the CPU, listed them while the CPU itself did not).
    info.supported_dtypes = {ScalarType::Bool,  ScalarType::Byte,   ScalarType::Char,         ScalarType::Short,
                             ScalarType::Int,   ScalarType::Long,   ScalarType::Float,        ScalarType::Double,
                             ScalarType::ComplexFloat, ScalarType::ComplexDouble};
    const bool native_bf16 = details.isa.avx512_bf16 || details.isa.amx_bf16 || details.isa.arm_bf16;
    const bool native_fp16 = details.isa.avx512_fp16 || details.isa.amx_fp16 || details.isa.arm_fp16;
    if (native_bf16) info.supported_dtypes.push_back(ScalarType::BFloat16);
    if (native_fp16) info.supported_dtypes.push_back(ScalarType::Half);
    info.features.bf16 = native_bf16;
    info.features.fp16 = native_fp16;
    info.features.unified_memory = true;  // the CPU is the host
    info.cpu = std::move(details);
    return info;
  }

  MemoryStats memory_stats(int index) const override {
    check_device_index(index);
    const system::ProcessMemory process = system::read_process_memory();
    const system::SystemMemory memory = system::read_system_memory();
    MemoryStats stats;
    stats.allocated_bytes = process.resident_bytes;
    stats.peak_allocated_bytes = process.peak_resident_bytes;
    stats.free_bytes = static_cast<int64_t>(memory.available_bytes);
    stats.total_bytes = static_cast<int64_t>(memory.total_bytes);
    // The CPU allocator keeps no cache and counts nothing: reserved/active/allocation and
    // OOM counts stay empty instead of being made up.
    stats.source = "os: process RSS and peak RSS from /proc/self/status, system memory from /proc/meminfo";
    return stats;
  }

  void reset_peak_memory_stats(int index) override {
    check_device_index(index);
    system::reset_process_peak_memory();
  }

  // Freed heap memory that glibc still holds is handed back to the operating system.
  void empty_cache() override { malloc_trim(0); }

  // CPU operators run to completion (including their intra-op threads) before returning, so
  // there is never queued work to wait for.
  void synchronize(int index) override { check_device_index(index); }

  c10::Stream current_stream(int index) const override {
    return c10::Stream(c10::Stream::DEFAULT, device(index));
  }
  c10::Stream new_stream(int index) const override {
    check_device_index(index);
    TORCH_CHECK(false, "the cpu backend has no streams other than the default one: CPU work runs "
                       "synchronously on the calling thread");
  }
  c10::Event new_event(bool /*enable_timing*/) const override {
    TORCH_CHECK(false, "the cpu backend has no events: CPU work runs synchronously on the calling "
                       "thread, so there is nothing to record or wait for");
  }
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<CpuBackend>(); }

}  // namespace torchbridge::adapters

#pragma once
// Readings from the operating system (Linux /proc and /sys) used by the CPU backend.
// Internal to libtorchbridge.

#include <torchbridge/device_info.h>

#include <cstdint>
#include <set>
#include <string>

namespace torchbridge::system {

struct CpuProcInfo {
  std::string model_name;
  std::string vendor;
  std::set<std::string> flags;  // x86 "flags" or ARM "Features"
  int physical_cores = 0;
  int logical_cores = 0;
};

// Parses /proc/cpuinfo text (a parameter, so tests can feed fixed text).
CpuProcInfo parse_cpuinfo(const std::string& text);
// Parses this machine's /proc/cpuinfo and /sys topology.
CpuProcInfo read_cpu();
CpuIsaFeatures isa_features_from_flags(const std::set<std::string>& flags);

struct SystemMemory {
  uint64_t total_bytes = 0;      // MemTotal
  uint64_t available_bytes = 0;  // MemAvailable: what can be allocated without swapping
};
SystemMemory read_system_memory();

struct ProcessMemory {
  int64_t resident_bytes = 0;       // VmRSS
  int64_t peak_resident_bytes = 0;  // VmHWM (resettable through /proc/self/clear_refs)
};
ProcessMemory read_process_memory();
// Resets VmHWM to the current RSS. Raises with the OS error when the kernel refuses.
void reset_process_peak_memory();

// Reads a whole small file (procfs/sysfs); raises naming the path when it cannot.
std::string read_text_file(const std::string& path);

}  // namespace torchbridge::system

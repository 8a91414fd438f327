#include "backends/system_probe.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace torchbridge::system {
namespace {

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

// Value in kB of a "Key:   1234 kB" line in a /proc file, in bytes; -1 when absent.
int64_t proc_kb_field(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      return std::stoll(line.substr(key.size() + 1)) * 1024;
    }
  }
  return -1;
}

// Physical cores from sysfs topology: distinct (package, core) pairs over online CPUs.
int count_physical_cores_sysfs(int logical_cores) {
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < logical_cores; ++cpu) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(dir + "physical_package_id"), core(dir + "core_id");
    std::string package_id, core_id;
    if (!(package >> package_id) || !(core >> core_id)) return 0;
    cores.emplace(package_id, core_id);
  }
  return static_cast<int>(cores.size());
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "cannot read ", path, ": ", std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

CpuProcInfo parse_cpuinfo(const std::string& text) {
  CpuProcInfo info;
  std::set<std::pair<std::string, std::string>> physical_cores;
  std::string physical_id, core_id;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "processor") {
      ++info.logical_cores;
    } else if (key == "model name" && info.model_name.empty()) {
      info.model_name = value;
    } else if ((key == "vendor_id" || key == "CPU implementer") && info.vendor.empty()) {
      info.vendor = value == "0x41" ? "ARM" : value;
    } else if ((key == "flags" || key == "Features") && info.flags.empty()) {
      std::istringstream words(value);
      for (std::string word; words >> word;) info.flags.insert(word);
    } else if (key == "physical id") {
      physical_id = value;
    } else if (key == "core id") {
      core_id = value;
      physical_cores.emplace(physical_id, core_id);
    }
  }
  info.physical_cores = static_cast<int>(physical_cores.size());
  return info;
}

CpuProcInfo read_cpu() {
  CpuProcInfo info = parse_cpuinfo(read_text_file("/proc/cpuinfo"));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0) info.logical_cores = static_cast<int>(online);
  // /proc/cpuinfo has no core ids on ARM; sysfs topology works everywhere Linux runs.
  if (const int from_sysfs = count_physical_cores_sysfs(info.logical_cores); from_sysfs > 0) {
    info.physical_cores = from_sysfs;
  }
  if (info.physical_cores == 0) info.physical_cores = info.logical_cores;
  return info;
}

CpuIsaFeatures isa_features_from_flags(const std::set<std::string>& flags) {
  const auto has = [&](const char* flag) { return flags.count(flag) > 0; };
  CpuIsaFeatures isa;
  isa.avx2 = has("avx2");
  isa.avx512f = has("avx512f");
  isa.avx512_bf16 = has("avx512_bf16");
  isa.amx_bf16 = has("amx_bf16");
  isa.avx512_fp16 = has("avx512_fp16");
  isa.amx_fp16 = has("amx_fp16");
  isa.arm_bf16 = has("bf16");
  isa.arm_fp16 = has("asimdhp");
  return isa;
}

SystemMemory read_system_memory() {
  const std::string text = read_text_file("/proc/meminfo");
  const int64_t total = proc_kb_field(text, "MemTotal");
  const int64_t available = proc_kb_field(text, "MemAvailable");
  TORCH_CHECK(total > 0 && available >= 0,
              "/proc/meminfo lacks MemTotal or MemAvailable (Linux 3.14+ is required)");
  return {static_cast<uint64_t>(total), static_cast<uint64_t>(available)};
}

ProcessMemory read_process_memory() {
  const std::string text = read_text_file("/proc/self/status");
  const int64_t rss = proc_kb_field(text, "VmRSS");
  const int64_t hwm = proc_kb_field(text, "VmHWM");
  TORCH_CHECK(rss >= 0 && hwm >= 0, "/proc/self/status lacks VmRSS or VmHWM");
  return {rss, hwm};
}

void reset_process_peak_memory() {
  // Writing "5" to clear_refs resets the peak RSS (VmHWM) to the current RSS (Linux 4.0+).
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot reset the CPU peak memory: opening /proc/self/clear_refs failed: ",
              std::strerror(errno));
  const ssize_t written = ::write(fd, "5", 1);
  const int saved_errno = errno;
  ::close(fd);
  TORCH_CHECK(written == 1, "cannot reset the CPU peak memory: writing /proc/self/clear_refs "
              "failed: ", std::strerror(saved_errno));
}

}  // namespace torchbridge::system

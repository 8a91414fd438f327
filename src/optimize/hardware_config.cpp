// The vendor sections of TorchBridgeConfig (include/torchbridge/optimize/hardware_config.h).
#include <torchbridge/optimize/hardware_config.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

constexpr std::array<std::string_view, 3> kFlashAttentionVersions = {"auto", "2", "3"};
constexpr std::array<std::string_view, 8> kAmdArchitectures = {"auto",  "CDNA1", "CDNA2", "CDNA3",
                                                               "CDNA4", "RDNA2", "RDNA3", "RDNA4"};
constexpr std::array<std::string_view, 2> kTpuPrecisions = {"bfloat16", "float32"};

template <std::size_t N>
void check_one_of(const std::string& value, const std::array<std::string_view, N>& allowed, const char* field) {
  std::string listed;
  for (const std::string_view option : allowed) {
    if (value == option) return;
    listed += (listed.empty() ? "" : ", ") + std::string(option);
  }
  TORCH_CHECK_VALUE(false, field, ": expected one of ", listed, ", got '", value, "'");
}

std::string describe(const DeviceInfo& device) {
  std::string text = device.backend + ":" + std::to_string(device.index);
  if (!device.name.empty()) text += " (" + device.name + ")";
  return text;
}

bool is_intel(const DeviceInfo& device) {
  return device.backend == "xpu" ||
         (device.backend == "cpu" && (device.vendor == "GenuineIntel" || device.vendor == "Intel"));
}

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  return text;
}

class Notes {
 public:
  explicit Notes(const DeviceInfo& device) : device_(device) {}
  void applies(const char* field, std::string detail) { notes_.push_back({field, true, std::move(detail)}); }
  void not_here(const char* field, std::string why) { notes_.push_back({field, false, std::move(why)}); }
  void not_vendor(const char* field, const char* vendor_hardware) {
    not_here(field, "has no effect on " + describe(device_) + ": it is for " + vendor_hardware);
  }
  std::vector<HardwareNote> take() { return std::move(notes_); }

 private:
  const DeviceInfo& device_;
  std::vector<HardwareNote> notes_;
};

void nvidia_notes(const NvidiaHardwareConfig& nvidia, const DeviceInfo& device, Notes& notes) {
  const bool here = device.backend == "cuda";
  if (nvidia.fp8_enabled) {
    constexpr const char* field = "hardware.nvidia.fp8_enabled";
    if (!here) {
      notes.not_vendor(field, "NVIDIA GPUs");
    } else if (!device.features.fp8) {
      notes.not_here(field, describe(device) + " (" + device.architecture + ") has no FP8 tensor cores (sm_89+)");
    } else {
      notes.applies(field, "O3 makes eligible Linear layers FP8 layers, whatever the precision around them");
    }
  }
  if (nvidia.flash_attention_version != "auto") {
    constexpr const char* field = "hardware.nvidia.flash_attention_version";
    if (!here) {
      notes.not_vendor(field, "NVIDIA GPUs");
    } else if (nvidia.flash_attention_version == "3") {
      TORCH_CHECK_VALUE(device.architecture == "sm_90", field, " = 3: FlashAttention-3 runs on Hopper (sm_90) only; ",
                        describe(device), " is ", device.architecture, ". Use \"2\" or \"auto\"");
      notes.applies(field, "scaled_dot_product_attention uses FlashAttention-3 (Python, where torch provides it)");
    } else if (!device.features.flash_attention) {
      notes.not_here(field, describe(device) + " (" + device.architecture + ") has no flash-attention kernel (sm_80+)");
    } else {
      notes.applies(field, "scaled_dot_product_attention uses torch's FlashAttention-2 kernel");
    }
  }
  if (nvidia.enable_oom_protection) {
    constexpr const char* field = "hardware.nvidia.enable_oom_protection";
    if (!here) {
      notes.not_vendor(field, "NVIDIA GPUs");
    } else {
      notes.applies(field, "a forward that runs out of memory frees cached blocks and is retried once (Python)");
    }
  }
}

void amd_notes(const AmdHardwareConfig& amd, const DeviceInfo& device, Notes& notes) {
  const bool here = device.backend == "rocm";
  if (amd.architecture != "auto") {
    constexpr const char* field = "hardware.amd.architecture";
    if (!here) {
      notes.not_vendor(field, "AMD GPUs");
    } else {
      const std::string family = amd_architecture_of(device.architecture);
      TORCH_CHECK_VALUE(family == amd.architecture, field, " is ", amd.architecture, " but ", describe(device),
                        " is ", device.architecture, family.empty() ? " (an unknown family)" : " (" + family + ")");
      notes.applies(field, describe(device) + " is " + device.architecture + " (" + family + "), as configured");
    }
  }
  if (!amd.enable_matrix_cores) {
    constexpr const char* field = "hardware.amd.enable_matrix_cores";
    if (!here) {
      notes.not_vendor(field, "AMD GPUs");
    } else {
      notes.applies(field, "no reduced precision on the matrix cores: precision auto is fp32, bf16/fp16/fp8 refused");
    }
  }
  if (amd.memory_pool_size_gb > 0) {
    constexpr const char* field = "hardware.amd.memory_pool_size_gb";
    if (!here) {
      notes.not_vendor(field, "AMD GPUs");
    } else {
      const double bytes = amd.memory_pool_size_gb * 1e9;
      if (device.total_memory_bytes) {
        const double total = static_cast<double>(*device.total_memory_bytes);
        TORCH_CHECK_VALUE(bytes <= total, field, " = ", amd.memory_pool_size_gb, " is more than ", describe(device),
                          " has (", gigabytes(total), ")");
      }
      notes.applies(field, "the caching allocator is capped at " + gigabytes(bytes) + " (Python)");
    }
  }
}

void intel_notes(const IntelHardwareConfig& intel, const DeviceInfo& device, Notes& notes) {
  if (intel.enable_ipex) {
    constexpr const char* field = "hardware.intel.enable_ipex";
    if (!is_intel(device)) {
      notes.not_vendor(field, "Intel CPUs and GPUs");
    } else {
      notes.applies(field, "intel_extension_for_pytorch.optimize() runs on the model (Python; it must be installed)");
    }
  }
  if (!intel.enable_onednn) {
    constexpr const char* field = "hardware.intel.enable_onednn";
    if (device.backend != "cpu") {
      notes.not_here(field, "has no effect on " + describe(device) + ": oneDNN is torch's CPU kernel library");
    } else {
      notes.applies(field, "torch's oneDNN (mkldnn) kernels are off");
    }
  }
  if (!intel.enable_amx) {
    constexpr const char* field = "hardware.intel.enable_amx";
    const bool has_amx = device.cpu && (device.cpu->isa.amx_bf16 || device.cpu->isa.amx_fp16);
    if (device.backend != "cpu") {
      notes.not_here(field, "has no effect on " + describe(device) + ": AMX is a CPU instruction set");
    } else {
      TORCH_CHECK_VALUE(!has_amx, field, " = false: oneDNN chooses its instruction set once per process; start the "
                        "program with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 to keep it off AMX");
      notes.not_here(field, describe(device) + " has no AMX, so nothing uses it anyway");
    }
  }
}

void tpu_notes(const TpuHardwareConfig& tpu, const DeviceInfo& device, Notes& notes) {
  const TpuHardwareConfig defaults;
  const bool here = device.backend == "tpu";
  TORCH_CHECK_VALUE(!here || tpu.cache_max_size == defaults.cache_max_size,
                    "hardware.tpu.cache_max_size: torch_xla's persistent cache has no size limit to set");
  const auto note = [&](const char* field) {
    if (!here) {
      notes.not_vendor(field, "TPUs");
    } else {
      notes.not_here(field, "UnifiedManager does not drive TPUs yet: the TPU backend (torch_xla, Python) prepares "
                            "models at O0 only");
    }
  };
  if (tpu.precision != defaults.precision) note("hardware.tpu.precision");
  if (tpu.enable_xla_cache) note("hardware.tpu.enable_xla_cache");
  if (tpu.cache_max_size != defaults.cache_max_size) note("hardware.tpu.cache_max_size");
}

}  // namespace

void validate(const HardwareConfig& hardware) {
  check_one_of(hardware.nvidia.flash_attention_version, kFlashAttentionVersions,
               "hardware.nvidia.flash_attention_version");
  check_one_of(hardware.amd.architecture, kAmdArchitectures, "hardware.amd.architecture");
  TORCH_CHECK_VALUE(std::isfinite(hardware.amd.memory_pool_size_gb) && hardware.amd.memory_pool_size_gb >= 0,
                    "hardware.amd.memory_pool_size_gb: expected a size in GB >= 0 (0: no cap), got ",
                    hardware.amd.memory_pool_size_gb);
  check_one_of(hardware.tpu.precision, kTpuPrecisions, "hardware.tpu.precision");
  TORCH_CHECK_VALUE(hardware.tpu.cache_max_size >= 1, "hardware.tpu.cache_max_size: expected >= 1, got ",
                    hardware.tpu.cache_max_size);
}

std::vector<HardwareNote> hardware_notes(const HardwareConfig& hardware, const DeviceInfo& device) {
  validate(hardware);
  Notes notes(device);
  nvidia_notes(hardware.nvidia, device, notes);
  amd_notes(hardware.amd, device, notes);
  intel_notes(hardware.intel, device, notes);
  tpu_notes(hardware.tpu, device, notes);
  return notes.take();
}

std::string amd_architecture_of(const std::string& gfx_target) {
  // The gfx target names the ISA; AMD's documentation groups them into families.
  const std::string target = gfx_target.substr(0, gfx_target.find(':'));  // "gfx90a:sramecc+:xnack-"
  if (target == "gfx908") return "CDNA1";
  if (target == "gfx90a") return "CDNA2";
  if (target == "gfx940" || target == "gfx941" || target == "gfx942") return "CDNA3";
  if (target == "gfx950") return "CDNA4";
  if (target.rfind("gfx103", 0) == 0) return "RDNA2";
  if (target.rfind("gfx11", 0) == 0) return "RDNA3";
  if (target.rfind("gfx12", 0) == 0) return "RDNA4";
  return "";
}

}  // namespace torchbridge

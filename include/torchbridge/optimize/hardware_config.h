#pragma once
// Vendor sections of TorchBridgeConfig (config.hardware.nvidia / amd / intel / tpu): settings that
// only mean something on one vendor's hardware. Every field does what its name says on that
// hardware or is refused with the reason. Elsewhere a field set away from its default is reported
// as not applying: in UnifiedManager's report and in `torchbridge info`. It is never silently
// ignored.

#include <torchbridge/device_info.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchbridge {

struct NvidiaHardwareConfig {
  // FP8 Linear layers at O3 on GPUs with FP8 tensor cores (sm_89+), whatever the precision of
  // the rest (autocast runs around them).
  bool fp8_enabled = false;
  // Which flash-attention implementation torch's scaled_dot_product_attention uses: "auto"
  // (torch's choice), "2" (torch's built-in FlashAttention-2), "3" (FlashAttention-3, Hopper
  // sm_90 only, when the installed torch provides it).
  std::string flash_attention_version = "auto";
  // Python: a forward that runs out of memory releases the caching allocator's unused blocks and
  // is retried once; a second failure raises with the device's memory figures.
  bool enable_oom_protection = false;
};

struct AmdHardwareConfig {
  // "auto", or the architecture the program was tuned for (CDNA1, CDNA2, CDNA3, CDNA4, RDNA2,
  // RDNA3, RDNA4): checked against the device's gfx target; a mismatch is an error.
  std::string architecture = "auto";
  // false: do not use the matrix cores (MFMA/WMMA) for reduced precision: precision "auto"
  // decides fp32, and bf16/fp16 by name are refused.
  bool enable_matrix_cores = true;
  // > 0: cap the caching allocator at this many GB (torch's per-process memory fraction).
  double memory_pool_size_gb = 0;
};

struct IntelHardwareConfig {
  // Run intel_extension_for_pytorch's optimize() on the model (it must be installed).
  bool enable_ipex = false;
  // false: torch's oneDNN (mkldnn) kernels off on the CPU.
  bool enable_onednn = true;
  // false cannot be done after oneDNN has started (it reads ONEDNN_MAX_CPU_ISA once), so it is
  // refused on CPUs with AMX, with that instruction.
  bool enable_amx = true;
};

struct TpuHardwareConfig {
  std::string precision = "bfloat16";  // "bfloat16" or "float32"
  bool enable_xla_cache = false;       // torch_xla's persistent compilation cache
  int64_t cache_max_size = 100;        // entries; torch_xla's cache has no size limit to set
};

struct HardwareConfig {
  NvidiaHardwareConfig nvidia;
  AmdHardwareConfig amd;
  IntelHardwareConfig intel;
  TpuHardwareConfig tpu;
};

// Raises c10::ValueError naming the field ("hardware.amd.architecture") and what it accepts.
void validate(const HardwareConfig& hardware);

// What each field set away from its default does on `device`: `applies` with what it will do,
// or not, with why (another vendor's device, a GPU without the feature, ...). Fields at their
// defaults produce no note. Raises c10::ValueError where a field asks for something the device
// cannot do and would otherwise be misleading (an AMD architecture that is not this GPU's;
// enable_amx = false on a CPU with AMX; flash attention 3 below sm_90).
struct HardwareNote {
  std::string field;  // "hardware.nvidia.fp8_enabled"
  bool applies = false;
  std::string detail;
};
std::vector<HardwareNote> hardware_notes(const HardwareConfig& hardware, const DeviceInfo& device);

// The AMD architecture family of a gfx target ("gfx942" -> "CDNA3"), or "" when unknown.
std::string amd_architecture_of(const std::string& gfx_target);

}  // namespace torchbridge

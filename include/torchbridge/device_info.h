#pragma once
// What a device is, as reported by the vendor's runtime or the operating system.
// Fields the source cannot answer are empty (std::nullopt / empty string), never guessed.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge {

// Capabilities that decide which precisions and kernels are worth using on a device.
struct DeviceFeatures {
  bool tf32 = false;             // TensorFloat-32 matmuls (NVIDIA sm_80+)
  bool bf16 = false;             // bfloat16 computed natively by the hardware
  bool fp16 = false;             // float16 computed natively by the hardware
  bool fp8 = false;              // float8 e4m3/e5m2 matmuls (NVIDIA sm_89+, AMD MI300+)
  bool flash_attention = false;  // torch's flash-attention SDPA kernel can run here
  bool unified_memory = false;   // device and host share one address space / physical memory
};

// The instruction-set features that decide reduced-precision speed on a CPU.
struct CpuIsaFeatures {
  bool avx2 = false;
  bool avx512f = false;
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_fp16 = false;
  bool arm_bf16 = false;  // ARMv8.6 BF16 extension ("bf16" in /proc/cpuinfo Features)
  bool arm_fp16 = false;  // ARMv8.2 half-precision arithmetic ("asimdhp")
};

struct CpuDetails {
  std::string model_name;
  int physical_cores = 0;
  int logical_cores = 0;
  uint64_t ram_bytes = 0;
  CpuIsaFeatures isa;
};

struct DeviceInfo {
  std::string name;     // e.g. "NVIDIA H100 80GB HBM3", or the CPU model name
  std::string vendor;   // e.g. "NVIDIA", "AMD", "Intel", "Apple", "GenuineIntel"
  std::string backend;  // canonical TorchBridge backend name: "cuda", "cpu", ...
  int index = 0;
  std::optional<uint64_t> total_memory_bytes;
  std::optional<uint64_t> free_memory_bytes;
  std::string architecture;                // "sm_90", "gfx942", "x86_64", ...
  std::optional<int> multiprocessor_count;  // SMs, compute units, or logical CPU cores
  std::string driver_version;
  std::string runtime_version;
  // Dtypes the hardware computes natively. Torch may still emulate others (e.g. bf16 on a CPU
  // without avx512_bf16); those are not listed because they run at a fraction of the speed.
  std::vector<c10::ScalarType> supported_dtypes;
  DeviceFeatures features;
  std::optional<CpuDetails> cpu;  // present only for the CPU backend
};

// Lower-case dtype name as torch prints it without the "torch." prefix ("float32", "bfloat16").
std::string dtype_name(c10::ScalarType dtype);

}  // namespace torchbridge

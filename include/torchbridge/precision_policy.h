#pragma once
// Which precision a device should compute in, decided from what its hardware really does
// (DeviceInfo's features and dtypes), with a reason a user can read. "auto" picks the fastest
// precision the hardware accelerates; a named precision is honoured when the device can compute
// it at all, and refused (naming the device and what it supports) when it cannot. Nothing here
// ever substitutes another precision for the one asked for.

#include <torchbridge/device_info.h>
#include <torchbridge/precision.h>

#include <string>
#include <string_view>
#include <vector>

namespace torchbridge {

// How a device runs a precision.
enum class PrecisionSupport {
  kNative,       // the hardware computes it (tensor cores, AVX512-BF16, ...)
  kEmulated,     // torch computes it in software: correct, usually slower than fp32
  kUnavailable,  // cannot be computed here (asking for it is an error)
};
const char* to_string(PrecisionSupport support);  // "native", "emulated", "unavailable"

struct PrecisionCapability {
  Precision precision;
  PrecisionSupport support;
  std::string reason;
};

struct PrecisionDecision {
  std::string requested;     // "auto" or the precision name the user gave
  Precision precision;       // what to compute in
  PrecisionSupport support;  // kNative or kEmulated, never kUnavailable
  std::string device;        // "cuda:0 (NVIDIA H100 80GB HBM3)": what the decision was made for
  std::string reason;
};

// Every precision of the precision table with how `device` runs it, highest precision first.
std::vector<PrecisionCapability> precision_capabilities(const DeviceInfo& device);

// `requested` is "auto" or a precision name (precision.h). "auto" chooses the first precision the
// hardware runs natively in the order fp8, bf16, fp16, tf32, fp32. Unknown names raise
// c10::ValueError listing the valid ones; a precision the device cannot compute raises
// c10::ValueError naming the device, the reason, and the precisions it does support.
PrecisionDecision decide_precision(const DeviceInfo& device, std::string_view requested);

}  // namespace torchbridge

#include <torchbridge/precision_policy.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchbridge {
namespace {

bool lists_dtype(const DeviceInfo& device, c10::ScalarType dtype) {
  return std::find(device.supported_dtypes.begin(), device.supported_dtypes.end(), dtype) !=
         device.supported_dtypes.end();
}

std::string describe_device(const DeviceInfo& device) {
  std::string text = device.backend + ":" + std::to_string(device.index);
  if (!device.name.empty() && device.name != text) text += " (" + device.name + ")";
  return text;
}

std::string architecture_suffix(const DeviceInfo& device) {
  return device.architecture.empty() ? "" : " (" + device.architecture + ")";
}

// Why the hardware computes bf16 / fp16 natively, in the terms of its own backend.
std::string native_half_reason(const DeviceInfo& device, bool bf16) {
  const char* dtype = bf16 ? "bfloat16" : "float16";
  if (device.cpu) {
    const CpuIsaFeatures& isa = device.cpu->isa;
    std::vector<std::string> units;
    if (bf16) {
      if (isa.amx_bf16) units.push_back("AMX-BF16");
      if (isa.avx512_bf16) units.push_back("AVX512-BF16");
      if (isa.arm_bf16) units.push_back("the ARM BF16 extension");
    } else {
      if (isa.amx_fp16) units.push_back("AMX-FP16");
      if (isa.avx512_fp16) units.push_back("AVX512-FP16");
      if (isa.arm_fp16) units.push_back("ARM half-precision arithmetic");
    }
    std::string joined;
    for (const auto& unit : units) joined += (joined.empty() ? "" : " and ") + unit;
    return "the CPU has " + joined + ", so " + dtype + " matmuls run in hardware";
  }
  if (device.backend == "cuda") {
    return std::string("NVIDIA") + architecture_suffix(device) + " has " + dtype + " tensor cores";
  }
  // An SDK device reports the dtypes its glue computes in (torch's CPU kernels, for the fallback):
  // the runtime interface carries no dtype list, so this cannot claim the chip does.
  return "the device reports " + std::string(dtype) + " among the dtypes it computes in (c10's DeviceCapability)";
}

PrecisionCapability half_capability(const DeviceInfo& device, Precision precision) {
  const bool bf16 = precision == Precision::kBf16;
  const bool native = bf16 ? device.features.bf16 : device.features.fp16;
  const char* dtype = bf16 ? "bfloat16" : "float16";
  if (native) return {precision, PrecisionSupport::kNative, native_half_reason(device, bf16)};
  if (device.cpu) {
    return {precision, PrecisionSupport::kEmulated,
            std::string("the CPU has no ") + (bf16 ? "AVX512-BF16, AMX-BF16 or ARM BF16" : "AVX512-FP16, AMX-FP16 or ARM FP16") +
                " unit: torch computes " + dtype + " by converting to float32, usually slower than fp32"};
  }
  // torch's CUDA and ROCm kernels take both halves on every GPU they run on, converting through
  // float32 where the hardware has no matrix units for them (torch.cuda.is_bf16_supported() is
  // true on a T4: including_emulation defaults to true).
  if (device.backend == "cuda" || device.backend == "rocm") {
    const std::string gpu = device.backend == "cuda" ? "NVIDIA" + architecture_suffix(device) : device.name;
    return {precision, PrecisionSupport::kEmulated,
            gpu + " has no " + dtype + " tensor cores that TorchBridge knows of: torch computes " + dtype +
                " by converting to float32, usually slower than fp32"};
  }
  return {precision, PrecisionSupport::kUnavailable,
          std::string("the device does not compute ") + dtype + architecture_suffix(device)};
}

PrecisionCapability capability_of(const DeviceInfo& device, Precision precision) {
  switch (precision) {
    case Precision::kFp64:
      if (lists_dtype(device, c10::ScalarType::Double)) {
        return {precision, PrecisionSupport::kNative, "the device computes float64"};
      }
      return {precision, PrecisionSupport::kUnavailable, "the device does not list float64 among its dtypes"};
    case Precision::kFp32:
      return {precision, PrecisionSupport::kNative, "every backend computes float32"};
    case Precision::kTf32:
      if (device.features.tf32) {
        return {precision, PrecisionSupport::kNative,
                "float32 matmuls and convolutions can run on TF32 tensor cores" + architecture_suffix(device)};
      }
      // Without TF32 units torch ignores the TF32 switch and computes float32: honouring the
      // request would silently give a different precision than asked.
      return {precision, PrecisionSupport::kUnavailable,
              "TF32 is a tensor-core mode of NVIDIA sm_80 and newer; this device has none"};
    case Precision::kBf16:
    case Precision::kFp16:
      return half_capability(device, precision);
    case Precision::kFp8:
      if (device.features.fp8) {
        return {precision, PrecisionSupport::kNative,
                "the hardware has float8 matmuls" + architecture_suffix(device)};
      }
      return {precision, PrecisionSupport::kUnavailable,
              "float8 matmuls need NVIDIA sm_89+ or AMD MI300+; this device has none"};
  }
  TORCH_CHECK(false, "precision ", static_cast<int>(precision), " has no capability rule");
}

std::string supported_list(const std::vector<PrecisionCapability>& capabilities) {
  std::string text;
  for (const auto& capability : capabilities) {
    if (capability.support == PrecisionSupport::kUnavailable) continue;
    text += (text.empty() ? "" : ", ") + std::string(name_of(capability.precision));
    if (capability.support == PrecisionSupport::kEmulated) text += " (emulated)";
  }
  return text;
}

}  // namespace

const char* to_string(PrecisionSupport support) {
  switch (support) {
    case PrecisionSupport::kNative:
      return "native";
    case PrecisionSupport::kEmulated:
      return "emulated";
    case PrecisionSupport::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

std::vector<PrecisionCapability> precision_capabilities(const DeviceInfo& device) {
  std::vector<PrecisionCapability> capabilities;
  for (const auto& row : precision_table()) capabilities.push_back(capability_of(device, row.precision));
  return capabilities;
}

PrecisionDecision decide_precision(const DeviceInfo& device, std::string_view requested) {
  const std::vector<PrecisionCapability> capabilities = precision_capabilities(device);
  const auto capability = [&](Precision precision) {
    return *std::find_if(capabilities.begin(), capabilities.end(),
                         [&](const PrecisionCapability& c) { return c.precision == precision; });
  };
  PrecisionDecision decision{std::string(requested), Precision::kFp32, PrecisionSupport::kNative,
                             describe_device(device), ""};
  if (requested == "auto") {
    // The fastest precision first; float32 is always native, so the loop always decides.
    constexpr std::array<Precision, 5> preference = {Precision::kFp8, Precision::kBf16, Precision::kFp16,
                                                     Precision::kTf32, Precision::kFp32};
    std::string passed_over;
    for (const Precision precision : preference) {
      const PrecisionCapability c = capability(precision);
      if (c.support == PrecisionSupport::kNative) {
        decision.precision = precision;
        decision.reason = "auto: " + c.reason + passed_over;
        return decision;
      }
      passed_over += "; not " + std::string(name_of(precision)) + ": " + c.reason;
    }
  }
  TORCH_CHECK_VALUE(!requested.empty(), "empty precision: expected 'auto' or one of the precision names");
  Precision precision;
  try {
    precision = parse_precision(requested);
  } catch (const c10::ValueError& error) {
    TORCH_CHECK_VALUE(false, error.msg(), ", or 'auto'");
  }
  const PrecisionCapability c = capability(precision);
  TORCH_CHECK_VALUE(c.support != PrecisionSupport::kUnavailable, "precision '", requested, "' cannot run on ",
                    decision.device, ": ", c.reason, ". This device supports: ", supported_list(capabilities));
  decision.precision = precision;
  decision.support = c.support;
  decision.reason = "requested: " + c.reason;
  return decision;
}

}  // namespace torchbridge

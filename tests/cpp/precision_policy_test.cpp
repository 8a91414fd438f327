#include <torchbridge/precision_policy.h>
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "device_descriptions.h"

#include <memory>
#include <optional>
#include <string>

namespace torchbridge {
namespace {

DeviceInfo h100() {
  DeviceInfo info;
  info.backend = "cuda";
  info.name = "NVIDIA H100 80GB HBM3";
  info.architecture = "sm_90";
  info.supported_dtypes = {c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half,
                           c10::ScalarType::BFloat16, c10::ScalarType::Float8_e4m3fn};
  info.features = {.tf32 = true, .bf16 = true, .fp16 = true, .fp8 = true};
  return info;
}

DeviceInfo t4() { return test_support::tesla_t4(); }

DeviceInfo cpu(bool avx512_bf16) {
  DeviceInfo info;
  info.backend = "cpu";
  info.name = "Some CPU";
  info.supported_dtypes = {c10::ScalarType::Float, c10::ScalarType::Double};
  info.cpu = CpuDetails{};
  info.cpu->isa.avx512_bf16 = avx512_bf16;
  info.features.bf16 = avx512_bf16;
  return info;
}

std::string error_of(const DeviceInfo& device, const std::string& requested) {
  try {
    decide_precision(device, requested);
  } catch (const c10::ValueError& e) {
    return e.msg();
  }
  return "";
}

TEST(PrecisionPolicy, AutoPicksTheFastestPrecisionTheHardwareAccelerates) {
  EXPECT_EQ(decide_precision(h100(), "auto").precision, Precision::kFp8);
  EXPECT_EQ(decide_precision(t4(), "auto").precision, Precision::kFp16);
  EXPECT_EQ(decide_precision(cpu(true), "auto").precision, Precision::kBf16);
  EXPECT_EQ(decide_precision(cpu(false), "auto").precision, Precision::kFp32);
  for (const auto& device : {h100(), t4(), cpu(true), cpu(false)}) {
    EXPECT_EQ(decide_precision(device, "auto").support, PrecisionSupport::kNative) << device.name;
  }
}

TEST(PrecisionPolicy, EveryDecisionSaysWhy) {
  const PrecisionDecision h = decide_precision(h100(), "auto");
  EXPECT_NE(h.reason.find("float8"), std::string::npos) << h.reason;
  EXPECT_NE(h.reason.find("sm_90"), std::string::npos) << h.reason;
  const PrecisionDecision c = decide_precision(cpu(true), "auto");
  EXPECT_NE(c.reason.find("AVX512-BF16"), std::string::npos) << c.reason;
  // What auto passed over is part of the reason too.
  EXPECT_NE(c.reason.find("not fp8"), std::string::npos) << c.reason;
  const PrecisionDecision plain = decide_precision(cpu(false), "auto");
  EXPECT_NE(plain.reason.find("not bf16"), std::string::npos) << plain.reason;
  EXPECT_EQ(plain.device, "cpu:0 (Some CPU)");
}

TEST(PrecisionPolicy, ANamedPrecisionIsHonouredOrRefusedNeverDowngraded) {
  EXPECT_EQ(decide_precision(h100(), "bf16").precision, Precision::kBf16);
  EXPECT_EQ(decide_precision(h100(), "fp32").precision, Precision::kFp32);
  // A CPU without bf16 units still computes bf16 (torch converts through float32): allowed, marked.
  const PrecisionDecision emulated = decide_precision(cpu(false), "bf16");
  EXPECT_EQ(emulated.precision, Precision::kBf16);
  EXPECT_EQ(emulated.support, PrecisionSupport::kEmulated);
  EXPECT_NE(emulated.reason.find("slower"), std::string::npos) << emulated.reason;

  const std::string fp8_on_t4 = error_of(t4(), "fp8");
  EXPECT_NE(fp8_on_t4.find("cuda:0 (Tesla T4)"), std::string::npos) << fp8_on_t4;
  EXPECT_NE(fp8_on_t4.find("sm_89"), std::string::npos) << fp8_on_t4;
  EXPECT_NE(fp8_on_t4.find("supports: fp64, fp32, fp16, bf16 (emulated)"), std::string::npos) << fp8_on_t4;
  // torch computes bf16 on a T4 through float32 (torch.cuda.is_bf16_supported() says true): honoured,
  // marked emulated; it used to be refused.
  const PrecisionDecision bf16_on_t4 = decide_precision(t4(), "bf16");
  EXPECT_EQ(bf16_on_t4.precision, Precision::kBf16);
  EXPECT_EQ(bf16_on_t4.support, PrecisionSupport::kEmulated);
  EXPECT_NE(bf16_on_t4.reason.find("NVIDIA (sm_75) has no bfloat16 tensor cores"), std::string::npos)
      << bf16_on_t4.reason;
  // A device whose backend TorchBridge knows nothing of computes what it reports, nothing more.
  DeviceInfo sdk_device = cpu(false);
  sdk_device.backend = "emu";
  sdk_device.cpu.reset();
  EXPECT_NE(error_of(sdk_device, "bf16").find("does not compute bfloat16"), std::string::npos);
  const std::string tf32_on_cpu = error_of(cpu(true), "tf32");
  EXPECT_NE(tf32_on_cpu.find("TF32"), std::string::npos) << tf32_on_cpu;
  EXPECT_NE(tf32_on_cpu.find("bf16"), std::string::npos) << tf32_on_cpu;
}

TEST(PrecisionPolicy, UnknownNamesListTheValidOnes) {
  const std::string message = error_of(h100(), "float8");
  EXPECT_NE(message.find("unknown precision 'float8'"), std::string::npos) << message;
  EXPECT_NE(message.find("fp8"), std::string::npos) << message;
  EXPECT_NE(message.find("'auto'"), std::string::npos) << message;
  EXPECT_NE(error_of(h100(), "").find("empty precision"), std::string::npos);
  EXPECT_NE(error_of(h100(), "AUTO").find("unknown precision 'AUTO'"), std::string::npos);
}

TEST(PrecisionPolicy, CapabilitiesCoverEveryPrecisionOfTheTable) {
  const auto capabilities = precision_capabilities(h100());
  ASSERT_EQ(capabilities.size(), precision_table().size());
  for (const auto& capability : capabilities) EXPECT_FALSE(capability.reason.empty());
}

TEST(PrecisionPolicy, TheRealCpuAgreesWithItsIsa) {
  const DeviceInfo info = create_backend("cpu")->info(0);
  ASSERT_TRUE(info.cpu.has_value());
  const CpuIsaFeatures& isa = info.cpu->isa;
  const bool bf16_units = isa.avx512_bf16 || isa.amx_bf16 || isa.arm_bf16;
  const bool fp16_units = isa.avx512_fp16 || isa.amx_fp16 || isa.arm_fp16;
  const Precision expected = bf16_units ? Precision::kBf16 : fp16_units ? Precision::kFp16 : Precision::kFp32;
  EXPECT_EQ(decide_precision(info, "auto").precision, expected) << decide_precision(info, "auto").reason;
}

}  // namespace
}  // namespace torchbridge

// The /proc/cpuinfo parser on fixed x86 and ARM texts.
#include "backends/system_probe.h"

#include <gtest/gtest.h>

namespace torchbridge::system {
namespace {

constexpr const char* kX86TwoPackages = R"(processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 0
core id		: 0
flags		: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 0
core id		: 0
flags		: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16

processor	: 2
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 1
core id		: 0
flags		: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16
)";

constexpr const char* kArm = R"(processor	: 0
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm
CPU implementer	: 0x41
CPU part	: 0xd4f

processor	: 1
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm
CPU implementer	: 0x41
CPU part	: 0xd4f
)";

TEST(SystemProbe, ParsesX86Cpuinfo) {
  const CpuProcInfo info = parse_cpuinfo(kX86TwoPackages);
  EXPECT_EQ(info.model_name, "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_EQ(info.vendor, "GenuineIntel");
  EXPECT_EQ(info.logical_cores, 3);
  EXPECT_EQ(info.physical_cores, 2);  // (package 0, core 0) twice (hyper-threads), (package 1, core 0)
  const CpuIsaFeatures isa = isa_features_from_flags(info.flags);
  EXPECT_TRUE(isa.avx2 && isa.avx512f && isa.avx512_bf16 && isa.amx_bf16 && isa.avx512_fp16);
  EXPECT_FALSE(isa.arm_bf16 || isa.amx_fp16);
}

TEST(SystemProbe, ParsesArmCpuinfo) {
  const CpuProcInfo info = parse_cpuinfo(kArm);
  EXPECT_EQ(info.vendor, "ARM");
  EXPECT_EQ(info.logical_cores, 2);
  EXPECT_EQ(info.physical_cores, 0);  // ARM cpuinfo has no core ids; read_cpu() uses sysfs instead
  const CpuIsaFeatures isa = isa_features_from_flags(info.flags);
  EXPECT_TRUE(isa.arm_bf16 && isa.arm_fp16);
  EXPECT_FALSE(isa.avx2 || isa.avx512_bf16);
}

TEST(SystemProbe, MissingFileIsANamedError) {
  try {
    read_text_file("/proc/does-not-exist");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(e.msg().find("/proc/does-not-exist"), std::string::npos) << e.msg();
  }
}

}  // namespace
}  // namespace torchbridge::system

// The configuration's vendor sections: what each field does on its vendor's device, that it is
// reported (not dropped) elsewhere, and the refusals, on fixed device descriptions; plus reading
// them from JSON, TOML and the environment, and the closest-name suggestion for a typo.
#include <torchbridge/optimize/config.h>
#include <torchbridge/optimize/hardware_config.h>
#include <torchbridge/optimize/plan.h>

#include <gtest/gtest.h>

#include "error_message.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

using test_support::error_of;

DeviceInfo device(const std::string& backend, const std::string& architecture) {
  DeviceInfo info;
  info.backend = backend;
  info.name = backend + " test device";
  info.architecture = architecture;
  info.supported_dtypes = {c10::ScalarType::Float};
  return info;
}

DeviceInfo h100() {
  DeviceInfo info = device("cuda", "sm_90");
  info.features = {.tf32 = true, .bf16 = true, .fp16 = true, .fp8 = true, .flash_attention = true};
  return info;
}

DeviceInfo mi250() {
  DeviceInfo info = device("rocm", "gfx90a:sramecc+:xnack-");
  info.total_memory_bytes = 64'000'000'000;
  return info;
}

DeviceInfo cpu(bool amx) {
  DeviceInfo info = device("cpu", "x86_64");
  info.vendor = "GenuineIntel";
  info.cpu = CpuDetails{};
  info.cpu->isa.amx_bf16 = amx;
  return info;
}

const HardwareNote& note(const std::vector<HardwareNote>& notes, const std::string& field) {
  for (const auto& n : notes) {
    if (n.field == field) return n;
  }
  ADD_FAILURE() << "no note for " << field;
  static const HardwareNote missing;
  return missing;
}

TEST(HardwareConfig, DefaultsSayNothing) {
  EXPECT_TRUE(hardware_notes(HardwareConfig{}, h100()).empty());
  EXPECT_TRUE(hardware_notes(HardwareConfig{}, cpu(false)).empty());
}

TEST(HardwareConfig, EachFieldAppliesOnItsVendorsDevice) {
  HardwareConfig hardware;
  hardware.nvidia = {.fp8_enabled = true, .flash_attention_version = "3", .enable_oom_protection = true};
  auto notes = hardware_notes(hardware, h100());
  EXPECT_TRUE(note(notes, "hardware.nvidia.fp8_enabled").applies);
  EXPECT_TRUE(note(notes, "hardware.nvidia.flash_attention_version").applies);
  EXPECT_TRUE(note(notes, "hardware.nvidia.enable_oom_protection").applies);

  hardware = {};
  hardware.amd = {.architecture = "CDNA2", .enable_matrix_cores = false, .memory_pool_size_gb = 8};
  notes = hardware_notes(hardware, mi250());
  EXPECT_NE(note(notes, "hardware.amd.architecture").detail.find("gfx90a:sramecc+:xnack- (CDNA2)"), std::string::npos);
  EXPECT_TRUE(note(notes, "hardware.amd.enable_matrix_cores").applies);
  EXPECT_NE(note(notes, "hardware.amd.memory_pool_size_gb").detail.find("capped at 8.0 GB"), std::string::npos);

  hardware = {};
  hardware.intel = {.enable_ipex = true, .enable_onednn = false, .enable_amx = false};
  notes = hardware_notes(hardware, cpu(false));
  EXPECT_TRUE(note(notes, "hardware.intel.enable_ipex").applies);
  EXPECT_TRUE(note(notes, "hardware.intel.enable_onednn").applies);
  EXPECT_FALSE(note(notes, "hardware.intel.enable_amx").applies);
  EXPECT_NE(note(notes, "hardware.intel.enable_amx").detail.find("has no AMX"), std::string::npos);
}

TEST(HardwareConfig, AnotherVendorsFieldIsReportedNotDropped) {
  HardwareConfig hardware;
  hardware.nvidia.fp8_enabled = true;
  hardware.amd.memory_pool_size_gb = 4;
  hardware.tpu.enable_xla_cache = true;
  const auto notes = hardware_notes(hardware, cpu(false));
  ASSERT_EQ(notes.size(), 3u);
  for (const auto& n : notes) EXPECT_FALSE(n.applies) << n.field;
  EXPECT_EQ(note(notes, "hardware.nvidia.fp8_enabled").detail,
            "has no effect on cpu:0 (cpu test device): it is for NVIDIA GPUs");
  EXPECT_NE(note(notes, "hardware.tpu.enable_xla_cache").detail.find("it is for TPUs"), std::string::npos);
  // An NVIDIA GPU without FP8 units says so.
  DeviceInfo a100 = h100();
  a100.architecture = "sm_80";
  a100.features.fp8 = false;
  EXPECT_NE(note(hardware_notes(hardware, a100), "hardware.nvidia.fp8_enabled").detail.find("has no FP8 tensor cores"),
            std::string::npos);
}

TEST(HardwareConfig, RefusesWhatTheDeviceCannotDo) {
  HardwareConfig hardware;
  hardware.amd.architecture = "CDNA3";
  EXPECT_NE(error_of([&] { hardware_notes(hardware, mi250()); })
                .find("hardware.amd.architecture is CDNA3 but rocm:0 (rocm test device) is gfx90a:sramecc+:xnack- (CDNA2)"),
            std::string::npos);
  hardware = {};
  hardware.amd.memory_pool_size_gb = 100;
  EXPECT_NE(error_of([&] { hardware_notes(hardware, mi250()); }).find("is more than rocm:0"), std::string::npos);
  hardware = {};
  hardware.intel.enable_amx = false;
  EXPECT_NE(error_of([&] { hardware_notes(hardware, cpu(true)); }).find("ONEDNN_MAX_CPU_ISA"), std::string::npos);
  hardware = {};
  hardware.nvidia.flash_attention_version = "3";
  DeviceInfo ada = h100();
  ada.architecture = "sm_89";
  EXPECT_NE(error_of([&] { hardware_notes(hardware, ada); }).find("Hopper (sm_90) only"), std::string::npos);
  hardware.nvidia.flash_attention_version = "4";
  EXPECT_NE(error_of([&] { validate(hardware); })
                .find("hardware.nvidia.flash_attention_version: expected one of auto, 2, 3, got '4'"),
            std::string::npos);
}

TEST(HardwareConfig, Fp8EnabledMakesO3UseFp8LayersAroundBf16) {
  TorchBridgeConfig config;
  config.optimization_level = OptLevel::O3;
  config.precision = "bf16";
  config.hardware.nvidia.fp8_enabled = true;
  const auto steps = plan_optimization(config, h100(), decide_precision(h100(), "bf16"), {.has_linear = true});
  bool fp8 = false, noted = false;
  for (const auto& s : steps) {
    if (s.name == "fp8") fp8 = s.apply;
    if (s.name == "hardware.nvidia.fp8_enabled") noted = s.apply;
  }
  EXPECT_TRUE(fp8);
  EXPECT_TRUE(noted);
}

TEST(HardwareConfig, ReadFromJsonTomlAndTheEnvironment) {
  TorchBridgeConfig config = config_from_json_text(
      R"({"hardware": {"nvidia": {"fp8_enabled": true}, "amd": {"memory_pool_size_gb": 8}}, "hardware.intel.enable_onednn": false})");
  EXPECT_TRUE(config.hardware.nvidia.fp8_enabled);
  EXPECT_EQ(config.hardware.amd.memory_pool_size_gb, 8.0);
  EXPECT_FALSE(config.hardware.intel.enable_onednn);
  // Written back nested, and read again the same.
  const std::string json = to_json_text(config);
  EXPECT_NE(json.find(R"("hardware":{"amd":{"architecture":"auto")"), std::string::npos) << json;
  EXPECT_TRUE(config_from_json_text(json).hardware.nvidia.fp8_enabled);

  const auto path = std::filesystem::temp_directory_path() / "torchbridge_hardware_test.toml";
  // Dotted keys before the first table; a table's keys are relative to it, as in TOML.
  std::ofstream(path) << "precision = \"bf16\"\nhardware.amd.architecture = \"CDNA3\"\n[hardware.nvidia]\n"
                         "flash_attention_version = \"2\"\n[hardware.tpu]\ncache_max_size = 50\n";
  const TorchBridgeConfig from_toml = load_config(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(from_toml.hardware.nvidia.flash_attention_version, "2");
  EXPECT_EQ(from_toml.hardware.tpu.cache_max_size, 50);
  EXPECT_EQ(from_toml.precision, "bf16");
  EXPECT_EQ(from_toml.hardware.amd.architecture, "CDNA3");

  const std::map<std::string, std::string> environment = {{"TORCHBRIDGE_HARDWARE_AMD_ARCHITECTURE", "CDNA3"},
                                                          {"TORCHBRIDGE_HARDWARE_AMD_MEMORY_POOL_SIZE_GB", "2.5"}};
  const TorchBridgeConfig from_env = with_environment({}, [&](const char* name) -> const char* {
    const auto found = environment.find(name);
    return found == environment.end() ? nullptr : found->second.c_str();
  });
  EXPECT_EQ(from_env.hardware.amd.architecture, "CDNA3");
  EXPECT_EQ(from_env.hardware.amd.memory_pool_size_gb, 2.5);
}

TEST(HardwareConfig, ATypoNamesTheClosestFieldAndAWrongTypeTheExpectedOne) {
  EXPECT_NE(error_of([] { config_from_json_text(R"({"hardware": {"nvidia": {"fp8_enable": true}}})", {}, "run.json"); })
                .find("run.json: unknown key 'hardware.nvidia.fp8_enable'; did you mean 'hardware.nvidia.fp8_enabled'?"),
            std::string::npos);
  EXPECT_NE(error_of([] { config_from_json_text(R"({"precison": "bf16"})"); }).find("did you mean 'precision'?"),
            std::string::npos);
  EXPECT_NE(error_of([] { config_from_json_text(R"({"hardware": {"amd": {"memory_pool_size_gb": "8"}}})"); })
                .find("'hardware.amd.memory_pool_size_gb': expected a number, got \"8\""),
            std::string::npos);
}

}  // namespace
}  // namespace torchbridge

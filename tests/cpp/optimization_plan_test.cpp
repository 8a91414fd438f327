#include <torchbridge/optimize/plan.h>

#include <gtest/gtest.h>

#include "device_descriptions.h"

#include <optional>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

DeviceInfo hopper() {
  DeviceInfo info;
  info.backend = "cuda";
  info.name = "NVIDIA H100 80GB HBM3";
  info.architecture = "sm_90";
  info.supported_dtypes = {c10::ScalarType::Float, c10::ScalarType::Double};
  info.features = {.tf32 = true, .bf16 = true, .fp16 = true, .fp8 = true};
  return info;
}

DeviceInfo bf16_cpu() {
  DeviceInfo info;
  info.backend = "cpu";
  info.supported_dtypes = {c10::ScalarType::Float, c10::ScalarType::Double};
  info.cpu = CpuDetails{};
  info.cpu->isa.avx512_bf16 = true;
  info.features.bf16 = true;
  return info;
}

std::vector<PlannedStep> plan(const TorchBridgeConfig& config, const DeviceInfo& device, const ModelTraits& model) {
  return plan_optimization(config, device, decide_precision(device, config.precision), model);
}

const PlannedStep& step(const std::vector<PlannedStep>& steps, const std::string& name) {
  for (const auto& s : steps) {
    if (s.name == name) return s;
  }
  static const PlannedStep missing{"<missing>", OptLevel::O0, false, "", ""};
  ADD_FAILURE() << "no step " << name;
  return missing;
}

TorchBridgeConfig at_level(OptLevel level, bool training = true) {
  TorchBridgeConfig config;
  config.optimization_level = level;
  config.training = training;
  return config;
}

TEST(OptimizationPlan, ALevelHasNoStepOfAHigherOne) {
  for (OptLevel level : {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3}) {
    for (const auto& s : plan(at_level(level), hopper(), {.python = true, .has_linear = true})) {
      EXPECT_LE(s.level, level) << s.name;
      EXPECT_FALSE(s.reason.empty()) << s.name;
    }
  }
  const auto o0 = plan(at_level(OptLevel::O0), hopper(), {});
  ASSERT_EQ(o0.size(), 4u);  // place, deterministic (off), activation_checkpointing (off), validate (off)
  EXPECT_TRUE(step(o0, "place").apply);
  EXPECT_FALSE(step(o0, "deterministic").apply);
}

TEST(OptimizationPlan, O1OnAnH100UsesTf32AndCudnnBenchmarkUnlessFp32WasAskedFor) {
  auto steps = plan(at_level(OptLevel::O1), hopper(), {});
  EXPECT_TRUE(step(steps, "tf32").apply);
  EXPECT_TRUE(step(steps, "cudnn_benchmark").apply);
  TorchBridgeConfig fp32 = at_level(OptLevel::O1);
  fp32.precision = "fp32";
  fp32.deterministic = true;
  steps = plan(fp32, hopper(), {});
  EXPECT_FALSE(step(steps, "tf32").apply);
  EXPECT_NE(step(steps, "tf32").reason.find("fp32 was requested explicitly"), std::string::npos);
  EXPECT_FALSE(step(steps, "cudnn_benchmark").apply);
  EXPECT_TRUE(step(steps, "deterministic").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O1), bf16_cpu(), {}), "tf32").apply);
}

TEST(OptimizationPlan, FusedOptimizersOnlyWherePythonHasThem) {
  EXPECT_TRUE(step(plan(at_level(OptLevel::O1), hopper(), {.python = true, .optimizer = "AdamW"}), "fused_optimizer").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O1), hopper(), {.python = true, .optimizer = "RMSprop"}), "fused_optimizer").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O1), hopper(), {.optimizer = "AdamW"}), "fused_optimizer").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O1), hopper(), {.python = true}), "fused_optimizer").apply);
  // fp16 training (autocast, from O2) scales the loss with our GradScaler, which steps unfused
  // optimizers only. At O1 nothing autocasts: the model trains in float32 and needs no scaler.
  TorchBridgeConfig fp16 = at_level(OptLevel::O2);
  fp16.precision = "fp16";
  const PlannedStep fused = step(plan(fp16, hopper(), {.python = true, .optimizer = "AdamW"}), "fused_optimizer");
  EXPECT_FALSE(fused.apply);
  EXPECT_NE(fused.reason.find("GradScaler"), std::string::npos) << fused.reason;
  fp16.optimization_level = OptLevel::O1;
  EXPECT_TRUE(step(plan(fp16, hopper(), {.python = true, .optimizer = "AdamW"}), "fused_optimizer").apply);
}

// A memory setting, at every level: applies to training Python and torch::nn models, and then
// keeps torch.compile off (it cannot trace the checkpoint's autograd node).
TEST(OptimizationPlan, ActivationCheckpointingIsForTrainingAndExcludesCompile) {
  TorchBridgeConfig config = at_level(OptLevel::O2);
  config.activation_checkpointing = true;
  const auto steps = plan(config, bf16_cpu(), {.python = true, .has_linear = true, .has_block_container = true});
  EXPECT_TRUE(step(steps, "activation_checkpointing").apply);
  EXPECT_EQ(step(steps, "activation_checkpointing").level, OptLevel::O0);
  EXPECT_FALSE(step(steps, "compile").apply);
  EXPECT_NE(step(steps, "compile").reason.find("torch.compile cannot trace"), std::string::npos);
  EXPECT_TRUE(step(plan(config, bf16_cpu(), {.has_linear = true}), "activation_checkpointing").apply);  // C++
  // A Python model without blocks to checkpoint: the step does not apply, so it keeps nothing off.
  const auto no_blocks = plan(config, bf16_cpu(), {.python = true, .has_linear = true});
  EXPECT_FALSE(step(no_blocks, "activation_checkpointing").apply);
  EXPECT_NE(step(no_blocks, "activation_checkpointing").reason.find("no nn.Sequential or nn.ModuleList"),
            std::string::npos);
  EXPECT_TRUE(step(no_blocks, "compile").apply) << step(no_blocks, "compile").reason;
  const auto scripted = plan(config, bf16_cpu(), {.python = true, .torchscript = true});
  EXPECT_FALSE(step(scripted, "activation_checkpointing").apply);
  EXPECT_NE(step(scripted, "activation_checkpointing").reason.find("TorchScript"), std::string::npos);
  config.training = false;
  EXPECT_EQ(step(plan(config, bf16_cpu(), {.python = true}), "activation_checkpointing").reason,
            "inference: no backward pass, no activations kept");
  EXPECT_TRUE(step(plan(config, bf16_cpu(), {.python = true}), "compile").apply);
}

TEST(OptimizationPlan, O2TrainingAutocastsAndKeepsMasterWeights) {
  const auto steps = plan(at_level(OptLevel::O2), bf16_cpu(), {.python = true, .has_linear = true});
  EXPECT_TRUE(step(steps, "autocast").apply);
  EXPECT_EQ(step(steps, "autocast").argument, "bfloat16");
  EXPECT_FALSE(step(steps, "low_precision_weights").apply);
  EXPECT_EQ(step(steps, "compile").argument, "inductor");
  // C++ cannot compile a torch::nn module; SDK devices compile with aot_eager.
  EXPECT_FALSE(step(plan(at_level(OptLevel::O2), bf16_cpu(), {.has_linear = true}), "compile").apply);
  DeviceInfo emu = bf16_cpu();
  emu.backend = "emu";
  emu.cpu.reset();
  EXPECT_EQ(step(plan(at_level(OptLevel::O2), emu, {.python = true}), "compile").argument, "aot_eager");
}

TEST(OptimizationPlan, EmulatedBf16OnAnOlderNvidiaGpuIsNotCompiled) {
  // inductor skips bfloat16 frames below sm_80 (with a warning) and runs them eagerly: the plan
  // used to report them compiled.
  const DeviceInfo t4 = test_support::tesla_t4();
  TorchBridgeConfig config = at_level(OptLevel::O2);
  config.precision = "bf16";
  const auto steps = plan(config, t4, {.python = true, .has_linear = true});
  EXPECT_TRUE(step(steps, "autocast").apply);
  EXPECT_FALSE(step(steps, "compile").apply);
  EXPECT_NE(step(steps, "compile").reason.find("below sm_80"), std::string::npos) << step(steps, "compile").reason;
  config.precision = "auto";  // fp16, which inductor compiles there
  EXPECT_TRUE(step(plan(config, t4, {.python = true, .has_linear = true}), "compile").apply);
}

TEST(OptimizationPlan, FullPrecisionHasNothingToAutocast) {
  TorchBridgeConfig config = at_level(OptLevel::O3, false);
  config.precision = "fp32";
  const auto steps = plan(config, bf16_cpu(), {.python = true, .has_linear = true});
  EXPECT_FALSE(step(steps, "autocast").apply);
  EXPECT_FALSE(step(steps, "low_precision_weights").apply);
  EXPECT_FALSE(step(steps, "fp8").apply);
  EXPECT_FALSE(step(steps, "int8_weights").apply);
}

TEST(OptimizationPlan, O3UsesFp8OnHardwareWithFp8) {
  const auto steps = plan(at_level(OptLevel::O3), hopper(), {.python = true, .has_linear = true});
  EXPECT_TRUE(step(steps, "fp8").apply);
  EXPECT_EQ(step(steps, "autocast").argument, "bfloat16");  // around the FP8 layers
  EXPECT_FALSE(step(steps, "int8_weights").apply);
}

// The switch on, on a device it cannot apply to: the reason said "fp8_enabled is off".
TEST(OptimizationPlan, Fp8AskedForByTheNvidiaSectionOnAnotherDeviceSaysWhyNot) {
  TorchBridgeConfig config = at_level(OptLevel::O3);
  config.hardware.nvidia.fp8_enabled = true;
  const auto& fp8 = step(plan(config, bf16_cpu(), {.python = true, .has_linear = true}), "fp8");
  EXPECT_FALSE(fp8.apply);
  EXPECT_NE(fp8.reason.find("hardware.nvidia.fp8_enabled is on, but this device (cpu) is not an NVIDIA GPU"),
            std::string::npos)
      << fp8.reason;
}

TEST(OptimizationPlan, O3InferenceOnABf16CpuStoresLinearWeightsInInt8) {
  const ModelTraits quantizable{.python = true, .has_linear = true, .has_int8_linear = true};
  const auto steps = plan(at_level(OptLevel::O3, false), bf16_cpu(), quantizable);
  EXPECT_TRUE(step(steps, "int8_weights").apply);
  EXPECT_TRUE(step(steps, "low_precision_weights").apply);
  EXPECT_FALSE(step(steps, "compile").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O3, true), bf16_cpu(), quantizable), "int8_weights").apply);
}

// Linear layers the int8 kernel cannot run (in_features 10): int8 quantized nothing, and compile
// was skipped for it anyway, so O3 did less than O2.
TEST(OptimizationPlan, O3CompilesWhereInt8WouldQuantizeNothing) {
  const auto steps = plan(at_level(OptLevel::O3, false), bf16_cpu(), {.python = true, .has_linear = true});
  EXPECT_FALSE(step(steps, "int8_weights").apply);
  EXPECT_NE(step(steps, "int8_weights").reason.find("no Linear layer the int8 kernel can run"), std::string::npos);
  EXPECT_TRUE(step(steps, "compile").apply);
  // TorchScript: the reason says so, not "the model has no Linear layer".
  const auto scripted = plan(at_level(OptLevel::O3, false), bf16_cpu(), {.python = true, .torchscript = true,
                                                                         .has_linear = true, .has_int8_linear = true});
  EXPECT_NE(step(scripted, "int8_weights").reason.find("TorchScript modules cannot have their Linear layers swapped"),
            std::string::npos);
}

TEST(OptimizationPlan, TorchScriptIsFrozenForInferenceOnly) {
  EXPECT_TRUE(step(plan(at_level(OptLevel::O1, false), bf16_cpu(), {.torchscript = true}), "freeze_torchscript").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O1, true), bf16_cpu(), {.torchscript = true}), "freeze_torchscript").apply);
  EXPECT_FALSE(step(plan(at_level(OptLevel::O1, false), bf16_cpu(), {}), "freeze_torchscript").apply);
}

}  // namespace
}  // namespace torchbridge

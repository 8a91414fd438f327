#include <torchbridge/optimize/manager.h>

#include "error_message.h"

#include <ATen/Context.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

using test_support::error_of;

TorchBridgeConfig cpu_config(OptLevel level, const std::string& precision, bool training) {
  TorchBridgeConfig config;
  config.backend = "cpu";
  config.optimization_level = level;
  config.precision = precision;
  config.training = training;
  return config;
}

const StepOutcome& outcome(const OptimizationReport& report, const std::string& name) {
  for (const auto& s : report.steps) {
    if (s.name == name) return s;
  }
  static const StepOutcome missing{"<missing>", OptLevel::O0, "", ""};
  ADD_FAILURE() << "no step " << name;
  return missing;
}

TEST(UnifiedManager, TrainingAtO2KeepsFloat32MasterWeightsAndHandsAutocastToTheCaller) {
  UnifiedManager manager(cpu_config(OptLevel::O2, "bf16", true));
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8));
  const OptimizationReport& report = manager.optimize(*model);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), c10::ScalarType::Float);
  EXPECT_EQ(outcome(report, "autocast").outcome, "caller");
  EXPECT_EQ(outcome(report, "low_precision_weights").outcome, "skipped");
  EXPECT_EQ(outcome(report, "compile").outcome, "skipped");
  EXPECT_EQ(manager.autocast_dtype(), c10::ScalarType::BFloat16);
  {
    const auto scope = manager.autocast();
    EXPECT_EQ(model->forward(at::randn({2, 8})).scalar_type(), c10::ScalarType::BFloat16);
  }
  EXPECT_EQ(model->forward(at::randn({2, 8})).scalar_type(), c10::ScalarType::Float);
  EXPECT_EQ(report.precision.precision, Precision::kBf16);
}

TEST(UnifiedManager, ALevelThatAppliesNothingBeyondO0SaysSo) {
  UnifiedManager manager(cpu_config(OptLevel::O1, "fp32", true));
  torch::nn::Sequential model(torch::nn::Linear(8, 8));  // nothing for O1 to act on
  const OptimizationReport& report = manager.optimize(*model);
  EXPECT_EQ(summary(report), "O1 applied nothing beyond O0 on cpu: every step of O1-O1 was skipped, each for the "
                             "reason shown");
  EXPECT_NE(to_json_text(report).find("\"summary\":\"O1 applied nothing beyond O0"), std::string::npos);
  UnifiedManager conv_manager(cpu_config(OptLevel::O1, "fp32", true));
  torch::nn::Sequential conv(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
  EXPECT_EQ(summary(conv_manager.optimize(*conv)), "O1 on cpu applied channels_last");
  // bf16 at O1: the report says it changes nothing yet (autocast and the weight cast are O2's).
  UnifiedManager bf16_manager(cpu_config(OptLevel::O1, "bf16", true));
  torch::nn::Sequential linear(torch::nn::Linear(8, 8));
  EXPECT_EQ(summary(bf16_manager.optimize(*linear)),
            "O1 applied nothing beyond O0 on cpu: every step of O1-O1 was skipped, each for the reason shown; "
            "precision bf16 takes effect from O2 (autocast), so at O1 the model computes in its own dtypes");
}

// fp64 lowers nothing and casts nothing up: a float32 module would compute in float32 under a
// report saying float64 (accepted silently before 2026-11-29); a float64 one is optimized.
TEST(UnifiedManager, Fp64RefusesAModuleThatDoesNotComputeInFloat64) {
  UnifiedManager manager(cpu_config(OptLevel::O2, "fp64", false));
  torch::nn::Sequential model(torch::nn::Linear(8, 8));
  model->eval();
  const std::string message = test_support::error_of([&] { manager.optimize(*model); });
  EXPECT_NE(message.find("precision fp64: the module's floating-point parameters are Float"), std::string::npos)
      << message;
  model->to(torch::kFloat64);
  EXPECT_NO_THROW(manager.optimize(*model));
}

// Normalization layers stay float32: autocast runs them in float32 whatever their weights are,
// and with bfloat16 weights the CPU kernels refused the float32 input ("mixed dtype (CPU)").
TEST(UnifiedManager, InferenceAtO2CastsFloatingPointTensorsOutsideNormalizationLayers) {
  UnifiedManager manager(cpu_config(OptLevel::O2, "bf16", false));
  torch::nn::Sequential model(torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})), torch::nn::Linear(8, 8),
                              torch::nn::BatchNorm1d(8));
  model->eval();
  const at::Tensor input = at::randn({4, 8});
  const at::Tensor before = model->forward(input);
  const StepOutcome& cast = outcome(manager.optimize(*model), "low_precision_weights");
  EXPECT_EQ(cast.outcome, "applied");
  EXPECT_NE(cast.detail.find("except in BatchNorm1d, LayerNorm layers"), std::string::npos) << cast.detail;
  for (const auto& p : model->named_parameters()) {
    const bool linear = p.key().starts_with("1.");
    EXPECT_EQ(p.value().scalar_type(), linear ? c10::ScalarType::BFloat16 : c10::ScalarType::Float) << p.key();
  }
  for (const auto& b : model->named_buffers()) {
    const bool counter = b.key().find("num_batches_tracked") != std::string::npos;
    EXPECT_EQ(b.value().scalar_type(), counter ? c10::ScalarType::Long : c10::ScalarType::Float) << b.key();
  }
  at::Tensor after;
  {
    const auto autocast = manager.autocast();
    after = model->forward(input);
  }
  EXPECT_TRUE(at::allclose(after.to(c10::ScalarType::Float), before, 0.05, 0.05));
}

// A module that reads a 4-D buffer with view(), which a channels-last buffer refuses.
struct ConvWithGrid : torch::nn::Module {
  ConvWithGrid() {
    register_module("conv", conv);
    grid = register_buffer("grid", at::randn({1, 2, 3, 4}));
  }
  torch::nn::Conv2d conv{torch::nn::Conv2dOptions(3, 8, 3)};
  at::Tensor grid;
};

TEST(UnifiedManager, ChannelsLastRestridesParametersOnly) {
  UnifiedManager manager(cpu_config(OptLevel::O1, "fp32", true));
  auto model = std::make_shared<ConvWithGrid>();
  EXPECT_EQ(outcome(manager.optimize(*model), "channels_last").outcome, "applied");
  EXPECT_TRUE(model->conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(model->grid.is_contiguous());
  EXPECT_EQ(model->grid.view({24}).numel(), 24);
}

TEST(UnifiedManager, O1PutsConvolutionWeightsInChannelsLast) {
  UnifiedManager manager(cpu_config(OptLevel::O1, "fp32", true));
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)), torch::nn::Linear(6, 6));
  const at::Tensor input = at::randn({2, 3, 8, 8});
  const at::Tensor before = model->forward(input);
  EXPECT_EQ(outcome(manager.optimize(*model), "channels_last").outcome, "applied");
  const at::Tensor weight = model->parameters()[0];
  EXPECT_TRUE(weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::allclose(model->forward(input), before, 1e-5, 1e-6));
}

TEST(UnifiedManager, DevelopmentPresetIsDeterministicAndOnlyPlaces) {
  const bool was = at::globalContext().deterministicAlgorithms();
  TorchBridgeConfig config = TorchBridgeConfig::for_development();
  config.backend = "cpu";
  UnifiedManager manager(config);
  torch::nn::Linear model(4, 4);
  const OptimizationReport& report = manager.optimize(*model);
  ASSERT_EQ(report.steps.size(), 4u);  // place, deterministic, activation_checkpointing (off), validate (C++: skipped)
  EXPECT_EQ(outcome(report, "place").outcome, "applied");
  EXPECT_EQ(outcome(report, "deterministic").outcome, "applied");
  EXPECT_EQ(outcome(report, "validate").outcome, "skipped");
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  at::globalContext().setDeterministicAlgorithms(was, false);
  EXPECT_NE(to_json_text(report).find("\"outcome\":\"applied\""), std::string::npos);
}

TEST(UnifiedManager, ActivationCheckpointingIsTheCallersInCpp) {
  TorchBridgeConfig config;
  config.backend = "cpu";
  config.optimization_level = OptLevel::O0;
  config.activation_checkpointing = true;
  UnifiedManager manager(config);
  torch::nn::Linear model(4, 4);
  const StepOutcome& step = outcome(manager.optimize(*model), "activation_checkpointing");
  EXPECT_EQ(step.outcome, "caller");
  EXPECT_NE(step.detail.find("memory::CheckpointedSequential"), std::string::npos) << step.detail;
}

TEST(UnifiedManager, TorchScriptInferenceIsFrozenAndGivesTheSameResult) {
  torch::jit::Module module("Scaled");
  // Modules built in C++ have no `training` attribute until given one; eval() then sets it.
  module.register_attribute("training", c10::BoolType::get(), true);
  module.register_parameter("weight", at::randn({4, 4}), false);
  module.define("def forward(self, x):\n  return x.matmul(self.weight).relu()\n");
  module.eval();
  const at::Tensor input = at::randn({3, 4});
  const at::Tensor expected = module.forward({input}).toTensor();
  UnifiedManager manager(cpu_config(OptLevel::O1, "fp32", false));
  torch::jit::Module frozen = manager.optimize(module);
  EXPECT_EQ(outcome(manager.report(), "freeze_torchscript").outcome, "applied");
  EXPECT_EQ(frozen.named_parameters().size(), 0u);  // inlined as constants
  EXPECT_TRUE(at::allclose(frozen.forward({input}).toTensor(), expected));
}

TEST(UnifiedManager, RefusalsHappenBeforeAnyModelIsTouched) {
  EXPECT_NE(error_of([] { UnifiedManager(cpu_config(OptLevel::O0, "fp8", true)); }).find("cannot run on cpu:0"),
            std::string::npos);
  TorchBridgeConfig bad_index = cpu_config(OptLevel::O0, "auto", true);
  bad_index.device_index = 3;
  EXPECT_NE(error_of([&] { UnifiedManager{bad_index}; }).find("3"), std::string::npos);
  TorchBridgeConfig unknown = cpu_config(OptLevel::O0, "auto", true);
  unknown.backend = "nvidai";
  EXPECT_NE(error_of([&] { UnifiedManager{unknown}; }).find("nvidai"), std::string::npos);
}

}  // namespace
}  // namespace torchbridge

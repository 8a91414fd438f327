#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

TEST(PrepareModel, O0PlacesEveryParameterOnTheBackendDevice) {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if (!entry.backend->is_available()) continue;
    torch::nn::Linear model(4, 3);
    entry.backend->prepare_model(*model, OptLevel::O0, 0);
    for (const auto& p : model->parameters()) EXPECT_EQ(p.device(), entry.backend->device(0)) << entry.name;
  }
}

TEST(PrepareModel, HigherLevelsRunTheOptimizationPlan) {
  auto cpu = create_backend("cpu");
  // O1: the convolution's weight goes channels-last; the module's results stay the same.
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 4, 3));
  cpu->prepare_model(*conv, OptLevel::O1);
  EXPECT_TRUE(conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  // O2 on a module in eval mode (inference): with bf16 or fp16 native here, weights are cast;
  // without, precision "auto" is fp32 and they stay float32. Either way the device's policy decides.
  torch::nn::Linear linear(4, 3);
  linear->eval();
  cpu->prepare_model(*linear, OptLevel::O2);
  const c10::ScalarType expected = [&] {
    const auto& f = cpu->info(0).features;
    return f.bf16 ? c10::ScalarType::BFloat16 : f.fp16 ? c10::ScalarType::Half : c10::ScalarType::Float;
  }();
  EXPECT_EQ(linear->weight.scalar_type(), expected);
  // In training mode the parameters stay float32 (master weights).
  torch::nn::Linear trained(4, 3);
  cpu->prepare_model(*trained, OptLevel::O3);
  EXPECT_EQ(trained->weight.scalar_type(), c10::ScalarType::Float);
}

TEST(PrepareModel, BadDeviceIndexIsRejected) {
  torch::nn::Linear model(2, 2);
  EXPECT_THROW(create_backend("cpu")->prepare_model(*model, OptLevel::O0, 3), c10::IndexError);
}

}  // namespace
}  // namespace torchbridge

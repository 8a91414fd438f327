#include <torchbridge/amp/autocast_scope.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

TEST(PrepareModel, O0PlacesEveryParameterOnTheBackendDevice) {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if (!entry.backend->is_available()) continue;
    torch::nn::Linear model(4, 3);
    EXPECT_FALSE(entry.backend->prepare_model(*model, OptLevel::O0, 0).autocast_dtype) << entry.name;
    for (const auto& p : model->parameters()) EXPECT_EQ(p.device(), entry.backend->device(0)) << entry.name;
  }
}

TEST(PrepareModel, HigherLevelsRunTheOptimizationPlan) {
  auto cpu = create_backend("cpu");
  // O1: the convolution's weight goes channels-last; the module's results stay the same.
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 4, 3));
  EXPECT_FALSE(cpu->prepare_model(*conv, OptLevel::O1).autocast_dtype);
  EXPECT_TRUE(conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  // O2 on a module in eval mode (inference): with bf16 or fp16 native here, weights are cast;
  // without, precision "auto" is fp32 and they stay float32. Either way the device's policy decides.
  torch::nn::Linear linear(4, 3);
  linear->eval();
  torch::nn::Linear reference = std::dynamic_pointer_cast<torch::nn::LinearImpl>(linear->clone());
  const PreparedModel prepared = cpu->prepare_model(*linear, OptLevel::O2);
  const c10::ScalarType expected = [&] {
    const auto& f = cpu->info(0).features;
    return f.bf16 ? c10::ScalarType::BFloat16 : f.fp16 ? c10::ScalarType::Half : c10::ScalarType::Float;
  }();
  EXPECT_EQ(linear->weight.scalar_type(), expected);
  // The caller learns the autocast its forward needs: float32 inputs reach the cast weights only
  // through it (before, prepare_model returned nothing, and forward raised a dtype mismatch).
  if (expected == c10::ScalarType::Float) {
    EXPECT_FALSE(prepared.autocast_dtype);
  } else {
    ASSERT_EQ(prepared.autocast_dtype, expected);
    const at::Tensor x = at::randn({2, 4});
    at::Tensor y;
    {
      amp::AutocastScope autocast(cpu->device_type(), amp::AutocastOptions{.dtype = *prepared.autocast_dtype});
      y = linear(x);
    }
    EXPECT_EQ(y.scalar_type(), expected);
    EXPECT_TRUE(at::allclose(y.to(at::kFloat), reference(x), 2e-2, 2e-2));
  }
  // In training mode the parameters stay float32 (master weights); forward autocasts.
  torch::nn::Linear trained(4, 3);
  const PreparedModel training = cpu->prepare_model(*trained, OptLevel::O3);
  EXPECT_EQ(trained->weight.scalar_type(), c10::ScalarType::Float);
  EXPECT_EQ(training.autocast_dtype, prepared.autocast_dtype);
}

TEST(PrepareModel, BadDeviceIndexIsRejected) {
  torch::nn::Linear model(2, 2);
  EXPECT_THROW(create_backend("cpu")->prepare_model(*model, OptLevel::O0, 3), c10::IndexError);
}

}  // namespace
}  // namespace torchbridge

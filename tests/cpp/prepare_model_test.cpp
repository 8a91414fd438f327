#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
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

TEST(PrepareModel, HigherLevelsAreRefusedNotSilentlyDowngraded) {
  auto cpu = create_backend("cpu");
  torch::nn::Linear model(4, 3);
  for (OptLevel level : {OptLevel::O1, OptLevel::O2, OptLevel::O3}) {
    try {
      cpu->prepare_model(*model, level);
      FAIL() << to_string(level) << " accepted";
    } catch (const c10::NotImplementedError& e) {
      EXPECT_NE(e.msg().find("not yet supported"), std::string::npos) << e.msg();
      EXPECT_NE(e.msg().find(to_string(level)), std::string::npos) << e.msg();
    }
  }
}

TEST(PrepareModel, BadDeviceIndexIsRejected) {
  torch::nn::Linear model(2, 2);
  EXPECT_THROW(create_backend("cpu")->prepare_model(*model, OptLevel::O0, 3), c10::IndexError);
}

}  // namespace
}  // namespace torchbridge

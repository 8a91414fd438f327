// torch::nn modules as validation subjects: copies by clone(), round trip through the portable
// checkpoint.
#include "validation/run_steps.h"

#include <torch/nn/modules/container/any.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::validation {
namespace {

torch::nn::AnyModule copy_of(const torch::nn::AnyModule& module, c10::Device device, c10::ScalarType dtype) {
  torch::nn::AnyModule copy;
  try {
    copy = module.clone(device);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "the torch::nn module cannot be copied to ", device,
                      " for validation: it must derive from torch::nn::Cloneable<T> (", e.msg().substr(0, 200), ")");
  }
  copy.ptr()->to(dtype);
  return copy;
}

class PlacedNnModule final : public PlacedModel {
 public:
  PlacedNnModule(torch::nn::AnyModule module, c10::Device device, c10::ScalarType dtype)
      : module_(std::move(module)), device_(device), dtype_(dtype) {}

  RunResult run(const std::vector<at::Tensor>& inputs, const OutputWeights& weights) override {
    const auto forward = [this](const std::vector<at::Tensor>& placed) -> std::vector<at::Tensor> {
      switch (placed.size()) {
        case 1: return {module_.forward(placed[0])};
        case 2: return {module_.forward(placed[0], placed[1])};
        case 3: return {module_.forward(placed[0], placed[1], placed[2])};
      }
      TORCH_CHECK_VALUE(false, "torch::nn modules are validated with 1 to 3 input tensors, not ", placed.size());
    };
    return run_model(forward, module_state(*module_.ptr()), place_inputs(inputs, device_, dtype_), weights,
                     checkpointed_);
  }

  void set_checkpointed_training(bool checkpointed) override { checkpointed_ = checkpointed; }

  // Through the portable checkpoint, as TorchScript models do (torchscript_model.cpp).
  std::unique_ptr<PlacedModel> save_and_reload() const override {
    torch::nn::AnyModule reloaded = copy_of(module_, device_, dtype_);
    assign(module_state(*reloaded.ptr()), checkpoint_round_trip(module_state(*module_.ptr()), device_));
    auto copy = std::make_unique<PlacedNnModule>(std::move(reloaded), device_, dtype_);
    copy->set_checkpointed_training(checkpointed_);
    return copy;
  }

 private:
  torch::nn::AnyModule module_;
  c10::Device device_;
  c10::ScalarType dtype_;
  bool checkpointed_ = false;
};

class NnModuleSource final : public ModelSource {
 public:
  explicit NnModuleSource(torch::nn::AnyModule module) : module_(std::move(module)) {}
  std::string kind() const override { return "torch::nn"; }
  std::unique_ptr<PlacedModel> place(c10::Device device, c10::ScalarType dtype,
                                     std::optional<c10::ScalarType> round_through) const override {
    torch::nn::AnyModule copy = copy_of(module_, device, round_through.value_or(dtype));
    if (round_through) copy.ptr()->to(dtype);
    return std::make_unique<PlacedNnModule>(std::move(copy), device, dtype);
  }

 private:
  torch::nn::AnyModule module_;
};

}  // namespace

std::unique_ptr<ModelSource> model_from(const torch::nn::AnyModule& module) {
  TORCH_CHECK_VALUE(!module.is_empty(), "model_from: the torch::nn::AnyModule is empty");
  return std::make_unique<NnModuleSource>(module);
}

}  // namespace torchbridge::validation

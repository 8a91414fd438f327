// TorchScript modules as validation subjects: copies by deepcopy, round trip through the
// portable checkpoint.
#include "validation/run_steps.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::validation {

std::vector<at::Tensor> output_tensors(const c10::IValue& value) {
  if (value.isTensor()) return {value.toTensor()};
  std::vector<at::Tensor> out;
  const auto append = [&](const c10::IValue& element) {
    const auto inner = output_tensors(element);
    out.insert(out.end(), inner.begin(), inner.end());
  };
  // As the Python side flattens outputs (torchbridge/_outputs.py): tuples, lists and dict values in
  // their order (a TorchScript dict keeps insertion order), and a None (attention's weights) left
  // out. A dict returned from a file was "the model does not run on the CPU".
  if (value.isTuple()) {
    for (const auto& element : value.toTupleRef().elements()) append(element);
  } else if (value.isList()) {
    for (const auto& element : value.toListRef()) append(element);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) append(entry.value());
  } else if (!value.isNone()) {
    TORCH_CHECK_VALUE(false, "the TorchScript module returned a ", value.tagKind(),
                      "; expected a tensor, or tuples, lists and dicts of tensors");
  }
  return out;
}

namespace {

// A deep copy whose parameters are leaves: deepcopy clones tensors with autograd recording, so a
// parameter that requires gradients would come back as a non-leaf whose .grad never fills in.
torch::jit::Module leaf_copy(const torch::jit::Module& module) {
  torch::jit::Module copy = module.deepcopy();
  for (at::Tensor p : copy.parameters()) {
    const bool requires_grad = p.requires_grad();
    p.detach_();
    p.requires_grad_(requires_grad);
  }
  return copy;
}

class PlacedTorchScript final : public PlacedModel {
 public:
  PlacedTorchScript(torch::jit::Module module, c10::Device device, c10::ScalarType dtype)
      : module_(std::move(module)), device_(device), dtype_(dtype) {}

  RunResult run(const std::vector<at::Tensor>& inputs, const OutputWeights& weights) override {
    const auto forward = [this](const std::vector<at::Tensor>& placed) {
      // The graph executor's optimiser profiles the first runs of every new copy and then swaps
      // in a specialised graph, so run 1 and run 2 would execute different code (and each copy
      // pays the profiling again). The validator checks the model as written.
      torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
      return output_tensors(module_.forward(std::vector<c10::IValue>(placed.begin(), placed.end())));
    };
    return run_model(forward, module_state(module_), place_inputs(inputs, device_, dtype_), weights, checkpointed_);
  }

  void set_checkpointed_training(bool checkpointed) override { checkpointed_ = checkpointed; }

  // Through the portable checkpoint rather than torch::jit::save/load: what is checked is that
  // the weights survive the trip to storage and back onto this device; recompiling the module's
  // code (which jit::load does, at several milliseconds) would check TorchScript instead.
  std::unique_ptr<PlacedModel> save_and_reload() const override {
    torch::jit::Module reloaded = leaf_copy(module_);
    assign(module_state(reloaded), checkpoint_round_trip(module_state(module_), device_));
    auto copy = std::make_unique<PlacedTorchScript>(std::move(reloaded), device_, dtype_);
    copy->set_checkpointed_training(checkpointed_);
    return copy;
  }

 private:
  torch::jit::Module module_;
  c10::Device device_;
  c10::ScalarType dtype_;
  bool checkpointed_ = false;
};

class TorchScriptSource final : public ModelSource {
 public:
  explicit TorchScriptSource(torch::jit::Module module) : module_(std::move(module)) {}
  std::string kind() const override { return "TorchScript"; }
  std::unique_ptr<PlacedModel> place(c10::Device device, c10::ScalarType dtype,
                                     std::optional<c10::ScalarType> round_through) const override {
    torch::jit::Module copy = leaf_copy(module_);
    if (round_through) copy.to(device, *round_through);
    copy.to(device, dtype);
    return std::make_unique<PlacedTorchScript>(std::move(copy), device, dtype);
  }

 private:
  torch::jit::Module module_;
};

}  // namespace

std::unique_ptr<ModelSource> model_from(const torch::jit::Module& module) {
  return std::make_unique<TorchScriptSource>(module);
}

}  // namespace torchbridge::validation

#pragma once
// What the training state knows of each LibTorch optimizer type (SGD, Adam, AdamW): its
// hyper-parameters per parameter group as JSON, and its per-parameter state as named tensors.
// One codec per type is the single place that dispatches on the optimizer type.

#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/module_state.h>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>

namespace torchbridge::checkpoint {

class OptimizerCodec {
 public:
  virtual ~OptimizerCodec() = default;
  // "SGD", "Adam" or "AdamW", as written in the file.
  virtual const char* type() const = 0;
  virtual bool handles(const torch::optim::OptimizerOptions& options) const = 0;
  // One group's hyper-parameters; the caller adds the group's parameter count.
  virtual nlohmann::json group_to_json(const torch::optim::OptimizerOptions& options) const = 0;
  // Raises ValueError naming `where` and the first field that is missing or of the wrong type.
  virtual void check_group(const nlohmann::json& group, const std::string& where) const = 0;
  // A copy of `current` carrying the saved hyper-parameters of a checked group.
  virtual std::unique_ptr<torch::optim::OptimizerOptions> group_from_json(
      const torch::optim::OptimizerOptions& current, const nlohmann::json& group) const = 0;
  // The state of one parameter as tensors named `key` + field ("optimizer.3.exp_avg").
  virtual void encode_state(const torch::optim::OptimizerParamState& state, const std::string& key,
                            NamedTensors& out) const = 0;
  // The state saved under `key`, placed and typed like `param`; null when none was saved (the
  // parameter had taken no step). Raises ValueError naming the tensor when one does not fit.
  virtual std::unique_ptr<torch::optim::OptimizerParamState> decode_state(const SafetensorsFile& file,
                                                                          const std::string& key,
                                                                          const at::Tensor& param) const = 0;
};

// The codec for every group of `optimizer`; raises NotImplementedError naming an unsupported
// optimizer's options type, or ValueError when groups mix optimizer types.
const OptimizerCodec& codec_for(const torch::optim::Optimizer& optimizer);
// The codec of a type name read from a file, or null when TorchBridge has none.
const OptimizerCodec* codec_named(const std::string& type);
// "SGD, Adam, AdamW", for messages.
std::string supported_optimizer_types();

}  // namespace torchbridge::checkpoint

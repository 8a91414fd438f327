#include "checkpoint/optimizer_codec.h"

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

using nlohmann::json;

// A saved group must carry each named field with a JSON number (or boolean) value.
void require_fields(const json& group, const std::string& where, const std::vector<const char*>& numbers,
                    const std::vector<const char*>& booleans) {
  TORCH_CHECK_VALUE(group.is_object(), where, " is not a JSON object");
  for (const char* field : numbers) {
    TORCH_CHECK_VALUE(group.contains(field) && group.at(field).is_number(), where, " has no number '", field, "'");
  }
  for (const char* field : booleans) {
    TORCH_CHECK_VALUE(group.contains(field) && group.at(field).is_boolean(), where, " has no boolean '", field, "'");
  }
}

// A saved tensor of the same shape as `param`, on its device and in its dtype.
at::Tensor load_like(const SafetensorsFile& file, const std::string& name, const at::Tensor& param) {
  const auto& record = file.record(name);
  TORCH_CHECK_VALUE(c10::IntArrayRef(record.shape) == param.sizes(), file.path(), ": optimizer state '", name,
                    "' has shape ", c10::IntArrayRef(record.shape), " but its parameter has ", param.sizes());
  return file.load(name).to(param.device(), param.scalar_type(), false, true);
}

class SgdCodec final : public OptimizerCodec {
 public:
  const char* type() const override { return "SGD"; }
  bool handles(const torch::optim::OptimizerOptions& o) const override {
    return dynamic_cast<const torch::optim::SGDOptions*>(&o) != nullptr;
  }
  json group_to_json(const torch::optim::OptimizerOptions& options) const override {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
    return {{"lr", o.lr()}, {"momentum", o.momentum()}, {"dampening", o.dampening()},
            {"weight_decay", o.weight_decay()}, {"nesterov", o.nesterov()}};
  }
  void check_group(const json& group, const std::string& where) const override {
    require_fields(group, where, {"lr", "momentum", "dampening", "weight_decay"}, {"nesterov"});
  }
  std::unique_ptr<torch::optim::OptimizerOptions> group_from_json(const torch::optim::OptimizerOptions& current,
                                                                  const json& g) const override {
    auto copy = current.clone();
    auto& o = static_cast<torch::optim::SGDOptions&>(*copy);
    o.lr(g.at("lr").get<double>()).momentum(g.at("momentum").get<double>()).dampening(g.at("dampening").get<double>());
    o.weight_decay(g.at("weight_decay").get<double>()).nesterov(g.at("nesterov").get<bool>());
    return copy;
  }
  void encode_state(const torch::optim::OptimizerParamState& state, const std::string& key,
                    NamedTensors& out) const override {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(state);
    if (s.momentum_buffer().defined()) out.emplace_back(key + "momentum_buffer", s.momentum_buffer());
  }
  std::unique_ptr<torch::optim::OptimizerParamState> decode_state(const SafetensorsFile& file, const std::string& key,
                                                                  const at::Tensor& param) const override {
    if (!file.contains(key + "momentum_buffer")) return nullptr;
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(load_like(file, key + "momentum_buffer", param));
    return s;
  }
};

// Adam and AdamW keep the same fields in two unrelated LibTorch types.
template <typename Options, typename State>
class AdamLikeCodec final : public OptimizerCodec {
 public:
  explicit AdamLikeCodec(const char* type) : type_(type) {}
  const char* type() const override { return type_; }
  bool handles(const torch::optim::OptimizerOptions& o) const override {
    // AdamWOptions is not an AdamOptions, so exact types tell them apart.
    return typeid(o) == typeid(Options);
  }
  json group_to_json(const torch::optim::OptimizerOptions& options) const override {
    const auto& o = static_cast<const Options&>(options);
    return {{"lr", o.lr()}, {"beta1", std::get<0>(o.betas())}, {"beta2", std::get<1>(o.betas())},
            {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad()}};
  }
  void check_group(const json& group, const std::string& where) const override {
    require_fields(group, where, {"lr", "beta1", "beta2", "eps", "weight_decay"}, {"amsgrad"});
  }
  std::unique_ptr<torch::optim::OptimizerOptions> group_from_json(const torch::optim::OptimizerOptions& current,
                                                                  const json& g) const override {
    auto copy = current.clone();
    auto& o = static_cast<Options&>(*copy);
    o.lr(g.at("lr").get<double>());
    o.betas(std::make_tuple(g.at("beta1").get<double>(), g.at("beta2").get<double>()));
    o.eps(g.at("eps").get<double>()).weight_decay(g.at("weight_decay").get<double>()).amsgrad(g.at("amsgrad").get<bool>());
    return copy;
  }
  void encode_state(const torch::optim::OptimizerParamState& state, const std::string& key,
                    NamedTensors& out) const override {
    const auto& s = static_cast<const State&>(state);
    out.emplace_back(key + "step", at::scalar_tensor(s.step(), at::kLong));
    out.emplace_back(key + "exp_avg", s.exp_avg());
    out.emplace_back(key + "exp_avg_sq", s.exp_avg_sq());
    if (s.max_exp_avg_sq().defined()) out.emplace_back(key + "max_exp_avg_sq", s.max_exp_avg_sq());
  }
  std::unique_ptr<torch::optim::OptimizerParamState> decode_state(const SafetensorsFile& file, const std::string& key,
                                                                  const at::Tensor& param) const override {
    if (!file.contains(key + "step")) return nullptr;
    // LibTorch counts steps in int64; torch.optim (Python files) in float32. Either holds one
    // whole number.
    const at::Tensor step = file.load(key + "step");
    const double value = step.numel() == 1 && !step.is_complex() ? step.item<double>() : 0.5;
    TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0 && std::floor(value) == value, file.path(),
                      ": optimizer state '", key, "step' is not one whole number (", step.scalar_type(), ", ",
                      step.numel(), " elements)");
    auto s = std::make_unique<State>();
    s->step(static_cast<int64_t>(value));
    s->exp_avg(load_like(file, key + "exp_avg", param)).exp_avg_sq(load_like(file, key + "exp_avg_sq", param));
    if (file.contains(key + "max_exp_avg_sq")) s->max_exp_avg_sq(load_like(file, key + "max_exp_avg_sq", param));
    return s;
  }

 private:
  const char* type_;
};

const std::array<const OptimizerCodec*, 3>& codecs() {
  static const SgdCodec sgd;
  static const AdamLikeCodec<torch::optim::AdamOptions, torch::optim::AdamParamState> adam("Adam");
  static const AdamLikeCodec<torch::optim::AdamWOptions, torch::optim::AdamWParamState> adamw("AdamW");
  static const std::array<const OptimizerCodec*, 3> all = {&sgd, &adam, &adamw};
  return all;
}

}  // namespace

std::string supported_optimizer_types() {
  std::string names;
  for (const auto* codec : codecs()) names += (names.empty() ? "" : ", ") + std::string(codec->type());
  return names;
}

const OptimizerCodec* codec_named(const std::string& type) {
  for (const auto* codec : codecs()) {
    if (type == codec->type()) return codec;
  }
  return nullptr;
}

const OptimizerCodec& codec_for(const torch::optim::Optimizer& optimizer) {
  const OptimizerCodec* found = nullptr;
  for (const auto& group : optimizer.param_groups()) {
    const auto& options = group.options();
    const OptimizerCodec* codec = nullptr;
    for (const auto* candidate : codecs()) {
      if (candidate->handles(options)) codec = candidate;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(codec != nullptr, "the training state supports the optimizers ",
                                supported_optimizer_types(), "; this one's options are ",
                                c10::demangle(typeid(options).name()));
    TORCH_CHECK_VALUE(found == nullptr || found == codec, "the optimizer's parameter groups mix ", found ? found->type() : "",
                      " and ", codec->type(), " options");
    found = codec;
  }
  TORCH_CHECK_VALUE(found != nullptr, "the optimizer has no parameter groups");
  return *found;
}

}  // namespace torchbridge::checkpoint

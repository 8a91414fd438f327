#include <torchbridge/checkpoint/training_state.h>

#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/registry.h>

#include <torchbridge/module_state.h>

#include <ATen/Context.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>

namespace torchbridge::checkpoint {
namespace {

using json = nlohmann::json;
constexpr const char* kFormat = "torchbridge.training_state/1";

std::vector<at::Tensor> optimizer_params(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

template <typename Options>
json adam_options_json(const Options& o) {
  return {{"lr", o.lr()}, {"beta1", std::get<0>(o.betas())}, {"beta2", std::get<1>(o.betas())},
          {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad()}};
}

// The optimizer's type and hyper-parameters per group, as JSON.
json describe(const torch::optim::Optimizer& optimizer) {
  json groups = json::array();
  std::string type;
  for (const auto& group : optimizer.param_groups()) {
    const auto& options = group.options();
    if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
      type = "SGD";
      groups.push_back({{"lr", o->lr()}, {"momentum", o->momentum()}, {"dampening", o->dampening()},
                        {"weight_decay", o->weight_decay()}, {"nesterov", o->nesterov()}});
    } else if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
      type = "AdamW";
      groups.push_back(adam_options_json(*o));
    } else if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
      type = "Adam";
      groups.push_back(adam_options_json(*o));
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(false, "saving optimizer state supports SGD, Adam and AdamW");
    }
    groups.back()["size"] = group.params().size();
  }
  return {{"type", type}, {"groups", groups}};
}

template <typename Options>
void restore_adam_like(Options& o, const json& g) {
  o.lr(g["lr"].get<double>());
  o.betas(std::make_tuple(g["beta1"].get<double>(), g["beta2"].get<double>()));
  o.eps(g["eps"].get<double>());
  o.weight_decay(g["weight_decay"].get<double>());
  o.amsgrad(g["amsgrad"].get<bool>());
}

// Adam and AdamW keep the same per-parameter fields in two unrelated LibTorch types.
template <typename State>
void add_adam_state(const State& s, const std::string& key, std::vector<std::pair<std::string, at::Tensor>>& out) {
  out.emplace_back(key + "step", at::scalar_tensor(s.step(), at::kLong));
  out.emplace_back(key + "exp_avg", s.exp_avg());
  out.emplace_back(key + "exp_avg_sq", s.exp_avg_sq());
  if (s.max_exp_avg_sq().defined()) out.emplace_back(key + "max_exp_avg_sq", s.max_exp_avg_sq());
}

template <typename State, typename LikeParam>
std::unique_ptr<State> adam_state_from(const SafetensorsFile& file, const std::string& key, const LikeParam& like_param) {
  auto s = std::make_unique<State>();
  s->step(file.load(key + "step").template item<int64_t>());
  s->exp_avg(like_param("exp_avg")).exp_avg_sq(like_param("exp_avg_sq"));
  if (file.contains(key + "max_exp_avg_sq")) s->max_exp_avg_sq(like_param("max_exp_avg_sq"));
  return s;
}

// Accelerator generators to save: every device of every available non-CPU backend.
std::vector<c10::Device> generator_devices() {
  std::vector<c10::Device> devices;
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if (entry.name == "cpu" || !entry.backend->is_available()) continue;
    for (int i = 0; i < entry.backend->device_count(); ++i) devices.push_back(entry.backend->device(i));
  }
  return devices;
}

c10::Device device_for(const std::string& name, const RestoreOptions& options, const c10::Device& current) {
  std::optional<std::pair<size_t, c10::Device>> best;
  for (const auto& [prefix, device] : options.device_map) {
    if (name.rfind(prefix, 0) == 0 && (!best || prefix.size() > best->first)) best = {prefix.size(), device};
  }
  return best ? best->second : current;
}

bool is_fp8(c10::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2; }

bool device_holds(const c10::Device& device, c10::ScalarType dtype) {
  const auto backend = BackendRegistry::instance().lookup(c10::DeviceTypeName(device.type(), true));
  const auto& dtypes = backend->info(device.has_index() ? device.index() : 0).supported_dtypes;
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

c10::ScalarType dtype_for(const at::Tensor& saved, const RestoreOptions& options, const c10::Device& device) {
  if (!saved.is_floating_point()) return saved.scalar_type();
  switch (options.dtype_policy) {
    case DtypePolicy::kKeep: return saved.scalar_type();
    case DtypePolicy::kCastFloating: return options.cast_to;
    case DtypePolicy::kConvertUnsupported: {
      const auto dtype = saved.scalar_type();
      if (dtype != at::kBFloat16 && dtype != at::kHalf && !is_fp8(dtype)) return dtype;
      if (device_holds(device, dtype)) return dtype;
      // fp8 widens to bf16 where the device has it; everything else to fp32.
      return is_fp8(dtype) && device_holds(device, at::kBFloat16) ? at::kBFloat16 : at::kFloat;
    }
  }
  return saved.scalar_type();
}

// An fp8 tensor converted to a wider dtype takes its stored scale into account: `<name>_scale`
// multiplies, `<name>_scale_inv` divides (the two conventions fp8 checkpoints use).
at::Tensor widen(const SafetensorsFile& file, const std::string& key, const at::Tensor& saved, c10::ScalarType dtype) {
  if (!is_fp8(saved.scalar_type()) || is_fp8(dtype)) return saved.to(dtype);
  const at::Tensor value = saved.to(at::kFloat);
  if (file.contains(key + "_scale")) return (value * file.load(key + "_scale").to(at::kFloat)).to(dtype);
  if (file.contains(key + "_scale_inv")) return (value / file.load(key + "_scale_inv").to(at::kFloat)).to(dtype);
  return value.to(dtype);
}

}  // namespace

std::vector<std::pair<std::string, c10::Device>> auto_device_map(
    const std::vector<std::pair<std::string, int64_t>>& tensor_bytes, const std::string& backend_name) {
  const auto backend = create_backend(backend_name);
  std::vector<std::pair<c10::Device, double>> devices;  // device, free bytes
  double free_total = 0;
  for (int i = 0; i < backend->device_count(); ++i) {
    const auto free = backend->memory_stats(i).free_bytes;
    TORCH_CHECK(free.has_value(), "the auto device map needs free memory, which backend '", backend->name(),
                "' does not report");
    devices.emplace_back(backend->device(i), double(*free));
    free_total += double(*free);
  }
  // Bytes per top-level module, in model order.
  std::vector<std::pair<std::string, int64_t>> modules;
  int64_t total = 0;
  for (const auto& [name, bytes] : tensor_bytes) {
    const std::string top = name.substr(0, name.find('.')) + ".";
    if (modules.empty() || modules.back().first != top) modules.emplace_back(top, 0);
    modules.back().second += bytes;
    total += bytes;
  }
  std::vector<std::pair<std::string, c10::Device>> map;
  size_t device = 0;
  double budget = total * devices[0].second / free_total, used = 0;
  for (const auto& [prefix, bytes] : modules) {
    // Move on once this device's share is taken (the last device takes whatever remains).
    if (used > 0 && used + bytes > budget + 1e-9 && device + 1 < devices.size()) {
      ++device;
      budget = total * devices[device].second / free_total;
      used = 0;
    }
    map.emplace_back(prefix, devices[device].first);
    used += bytes;
  }
  return map;
}

// The model's parameters and buffers, by name, are all the state functions need of a model, so
// torch::nn and TorchScript modules share them.
static void save_state_of(const std::string& path, const NamedTensors& model_state,
                   const torch::optim::Optimizer& optimizer, const TrainingProgress& progress) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  json devices = json::object(), dtypes = json::object();
  for (const auto& [name, tensor] : model_state) {
    tensors.emplace_back("model." + name, tensor.detach());
    devices[name] = tensor.device().str();
    dtypes[name] = c10::toString(tensor.scalar_type());
  }
  const json optimizer_json = describe(optimizer);
  const auto params = optimizer_params(optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = optimizer.state().find(params[i].unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;  // no step taken for this parameter yet
    const std::string key = "optimizer." + std::to_string(i) + ".";
    if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
      if (s->momentum_buffer().defined()) tensors.emplace_back(key + "momentum_buffer", s->momentum_buffer());
    } else if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get())) {
      add_adam_state(*s, key, tensors);
    } else if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
      add_adam_state(*s, key, tensors);
    }
  }
  tensors.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  for (const auto& device : generator_devices()) {
    tensors.emplace_back("rng." + device.str(), at::globalContext().defaultGenerator(device).get_state());
  }
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"torchbridge.step", std::to_string(progress.step)},
      {"torchbridge.epoch", std::to_string(progress.epoch)},
      {"torchbridge.optimizer", optimizer_json.dump()},
      {"torchbridge.source_devices", devices.dump()},
      {"torchbridge.source_dtypes", dtypes.dump()},
      {"torchbridge.source_backend", detect_best_backend()},
  };
  for (const auto& [key, value] : progress.user_metadata) metadata["user." + key] = value;
  save(path, tensors, metadata);
}

static TrainingProgress load_state_into(const std::string& path, const NamedTensors& model_state,
                                 torch::optim::Optimizer& optimizer, const RestoreOptions& options) {
  const auto file = SafetensorsFile::open(path);
  const auto& metadata = file.metadata();
  TORCH_CHECK_VALUE(metadata.count("format") && metadata.at("format") == kFormat, path,
                    ": not a TorchBridge training state (metadata format is not ", kFormat, ")");
  // Everything is checked before anything changes: a failed restore leaves model and optimizer
  // exactly as they were.
  for (const auto& [name, tensor] : model_state) {
    TORCH_CHECK_VALUE(file.contains("model." + name), path, ": the model has '", name, "' but the state does not");
    const auto& saved = file.record("model." + name);
    TORCH_CHECK_VALUE(c10::IntArrayRef(saved.shape) == tensor.sizes(), path, ": '", name, "' was saved with shape ",
                      c10::IntArrayRef(saved.shape), " but the model's is ", tensor.sizes());
  }
  const json description = json::parse(metadata.at("torchbridge.optimizer"));
  const json current = describe(optimizer);
  TORCH_CHECK_VALUE(current["type"] == description["type"], path, ": the state holds a ",
                    description["type"].get<std::string>(), " optimizer but a ", current["type"].get<std::string>(),
                    " was given");
  auto& groups = optimizer.param_groups();
  TORCH_CHECK_VALUE(groups.size() == description["groups"].size(), path, ": parameter group count differs");
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t saved_size = description["groups"][g]["size"].get<size_t>();
    TORCH_CHECK_VALUE(saved_size == groups[g].params().size(), path, ": parameter group ", g, " has ",
                      groups[g].params().size(), " parameters but ", saved_size, " were saved");
  }
  RestoreOptions placement = options;
  if (!options.auto_backend.empty()) {
    std::vector<std::pair<std::string, int64_t>> sizes;
    for (const auto& [name, tensor] : model_state) sizes.emplace_back(name, int64_t(tensor.nbytes()));
    placement.device_map = auto_device_map(sizes, options.auto_backend);
  }
  // Model: every parameter and buffer, each on its mapped device in the policy's dtype.
  for (const auto& [name, tensor] : model_state) {
    const at::Tensor saved = file.load("model." + name);
    const c10::Device device = device_for(name, placement, tensor.device());
    at::Tensor placed = widen(file, "model." + name, saved, dtype_for(saved, options, device)).to(device, false, true);
    at::NoGradGuard no_grad;
    tensor.set_data(placed);
  }
  // Optimizer: hyper-parameters, then per-parameter state beside each (now placed) parameter.
  for (size_t g = 0; g < groups.size(); ++g) {
    const json& saved = description["groups"][g];
    auto& options_g = groups[g].options();
    if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options_g)) {
      o->lr(saved["lr"]).momentum(saved["momentum"]).dampening(saved["dampening"]);
      o->weight_decay(saved["weight_decay"]).nesterov(saved["nesterov"]);
    } else if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options_g)) {
      restore_adam_like(*o, saved);
    } else if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options_g)) {
      restore_adam_like(*o, saved);
    }
  }
  const auto params = optimizer_params(optimizer);
  const std::string type = description["type"];
  auto& state = optimizer.state();
  state.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = "optimizer." + std::to_string(i) + ".";
    const auto like_param = [&](const std::string& name) {
      return file.load(key + name).to(params[i].device(), params[i].scalar_type(), false, true);
    };
    if (type == "SGD") {
      if (!file.contains(key + "momentum_buffer")) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(like_param("momentum_buffer"));
      state[params[i].unsafeGetTensorImpl()] = std::move(s);
      continue;
    }
    if (!file.contains(key + "step")) continue;
    if (type == "Adam") {
      state[params[i].unsafeGetTensorImpl()] = adam_state_from<torch::optim::AdamParamState>(file, key, like_param);
    } else {
      state[params[i].unsafeGetTensorImpl()] = adam_state_from<torch::optim::AdamWParamState>(file, key, like_param);
    }
  }
  if (options.restore_rng) {
    // Generators are handles: a copy sets the process's default generator itself.
    const auto restore = [&](at::Generator generator, const std::string& key) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(file.load(key));
    };
    restore(at::detail::getDefaultCPUGenerator(), "rng.cpu");
    for (const auto& device : generator_devices()) {
      if (file.contains("rng." + device.str())) restore(at::globalContext().defaultGenerator(device), "rng." + device.str());
    }
  }
  TrainingProgress progress;
  progress.step = std::stoll(metadata.at("torchbridge.step"));
  progress.epoch = std::stoll(metadata.at("torchbridge.epoch"));
  for (const auto& [key, value] : metadata) {
    if (key.rfind("user.", 0) == 0) progress.user_metadata[key.substr(5)] = value;
  }
  return progress;
}

void save_training_state(const std::string& path, const torch::nn::Module& model,
                         const torch::optim::Optimizer& optimizer, const TrainingProgress& progress) {
  save_state_of(path, module_state(model), optimizer, progress);
}

void save_training_state(const std::string& path, const torch::jit::Module& model,
                         const torch::optim::Optimizer& optimizer, const TrainingProgress& progress) {
  save_state_of(path, module_state(model), optimizer, progress);
}

TrainingProgress load_training_state(const std::string& path, torch::nn::Module& model,
                                     torch::optim::Optimizer& optimizer, const RestoreOptions& options) {
  return load_state_into(path, module_state(model), optimizer, options);
}

TrainingProgress load_training_state(const std::string& path, torch::jit::Module& model,
                                     torch::optim::Optimizer& optimizer, const RestoreOptions& options) {
  return load_state_into(path, module_state(model), optimizer, options);
}

}  // namespace torchbridge::checkpoint

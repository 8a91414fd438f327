// Saving and restoring a training run: the orchestration. What each optimizer type keeps is in
// optimizer_codec, where tensors go in placement_policy, and what the metadata must hold in
// training_metadata. A restore reads, checks and places everything first (the staged state), and
// only then changes the model, the optimizer and the generators, undoing all of it if a change
// fails: a failed restore leaves them as they were.
#include <torchbridge/checkpoint/training_state.h>

#include "checkpoint/optimizer_codec.h"
#include "checkpoint/placement_policy.h"
#include "checkpoint/training_metadata.h"

#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/module_state.h>
#include <torchbridge/registry.h>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

using json = nlohmann::json;

std::vector<at::Tensor> optimizer_params(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

// The optimizer's type and hyper-parameters per group, as JSON.
json describe(const torch::optim::Optimizer& optimizer) {
  const OptimizerCodec& codec = codec_for(optimizer);
  json groups = json::array();
  for (const auto& group : optimizer.param_groups()) {
    groups.push_back(codec.group_to_json(group.options()));
    groups.back()["size"] = group.params().size();
  }
  return {{"type", codec.type()}, {"groups", groups}};
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

// The model's parameters and buffers, by name, are all the state functions need of a model, so
// torch::nn and TorchScript modules share them.
void save_state_of(const std::string& path, const NamedTensors& model_state, const torch::optim::Optimizer& optimizer,
                   const TrainingProgress& progress) {
  NamedTensors tensors;
  json devices = json::object(), dtypes = json::object();
  for (const auto& [name, tensor] : model_state) {
    tensors.emplace_back("model." + name, tensor.detach());
    devices[name] = tensor.device().str();
    dtypes[name] = c10::toString(tensor.scalar_type());
  }
  const OptimizerCodec& codec = codec_for(optimizer);
  const json optimizer_json = describe(optimizer);
  const auto params = optimizer_params(optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = optimizer.state().find(params[i].unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;  // no step taken for this parameter yet
    codec.encode_state(*it->second, "optimizer." + std::to_string(i) + ".", tensors);
  }
  tensors.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  for (const auto& device : generator_devices()) {
    tensors.emplace_back("rng." + device.str(), at::globalContext().defaultGenerator(device).get_state());
  }
  std::map<std::string, std::string> metadata = {
      {"format", kTrainingStateFormat},
      {"torchbridge.step", std::to_string(progress.step)},
      {"torchbridge.epoch", std::to_string(progress.epoch)},
      {"torchbridge.optimizer", optimizer_json.dump()},
      {"torchbridge.source_devices", devices.dump()},
      {"torchbridge.source_dtypes", dtypes.dump()},
      {"torchbridge.source_backend", detect_best_backend()},
  };
  for (const auto& [key, value] : progress.user_metadata) metadata["user." + key] = value;
  if (progress.grad_scaler) metadata["torchbridge.grad_scaler"] = grad_scaler_to_json(*progress.grad_scaler);
  if (!progress.lr_scheduler.empty()) {
    const json scheduler = json::parse(progress.lr_scheduler, nullptr, /*allow_exceptions=*/false);
    TORCH_CHECK_VALUE(scheduler.is_object(), path, ": TrainingProgress::lr_scheduler is not a JSON object: '",
                      progress.lr_scheduler.substr(0, 80), "'");
    metadata["torchbridge.lr_scheduler"] = progress.lr_scheduler;
  }
  save(path, tensors, metadata);
}

// Everything a restore will change, read, checked and placed, with nothing changed yet.
struct StagedRestore {
  std::vector<std::pair<at::Tensor, at::Tensor>> model;  // (model tensor, placed value)
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> group_options;
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> param_states;
  std::vector<std::pair<at::Generator, at::Tensor>> generators;  // (generator, state to set)
  TrainingProgress progress;
};

void check_shapes_and_groups(const SafetensorsFile& file, const NamedTensors& model_state,
                             const torch::optim::Optimizer& optimizer, const TrainingMetadata& metadata) {
  const std::string& path = file.path();
  for (const auto& [name, tensor] : model_state) {
    TORCH_CHECK_VALUE(file.contains("model." + name), path, ": the model has '", name, "' but the state does not");
    const auto& saved = file.record("model." + name);
    TORCH_CHECK_VALUE(c10::IntArrayRef(saved.shape) == tensor.sizes(), path, ": '", name, "' was saved with shape ",
                      c10::IntArrayRef(saved.shape), " but the model's is ", tensor.sizes());
  }
  const std::string saved_type = metadata.optimizer.at("type").get<std::string>();
  const std::string given_type = codec_for(optimizer).type();
  TORCH_CHECK_VALUE(saved_type == given_type, path, ": the state holds a ", saved_type, " optimizer but a ",
                    given_type, " was given");
  const auto& saved_groups = metadata.optimizer.at("groups");
  const auto& groups = optimizer.param_groups();
  TORCH_CHECK_VALUE(groups.size() == saved_groups.size(), path, ": the state has ", saved_groups.size(),
                    " parameter groups but the optimizer has ", groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t saved_size = saved_groups[g].at("size").get<size_t>();
    TORCH_CHECK_VALUE(saved_size == groups[g].params().size(), path, ": parameter group ", g, " has ",
                      groups[g].params().size(), " parameters but ", saved_size, " were saved");
  }
}

StagedRestore stage(const SafetensorsFile& file, const NamedTensors& model_state,
                    const torch::optim::Optimizer& optimizer, const RestoreOptions& options) {
  const TrainingMetadata metadata = read_training_metadata(file.metadata(), file.path());
  check_shapes_and_groups(file, model_state, optimizer, metadata);
  StagedRestore staged;
  staged.progress = {metadata.step, metadata.epoch, metadata.user, metadata.grad_scaler, metadata.lr_scheduler};

  RestoreOptions placement = options;
  if (!options.auto_backend.empty()) {
    std::vector<std::pair<std::string, int64_t>> sizes;
    for (const auto& [name, tensor] : model_state) sizes.emplace_back(name, int64_t(tensor.nbytes()));
    placement.device_map = auto_device_map(sizes, options.auto_backend);
  }
  // A prefix the caller gave that places nothing is a mistake (a typo moved nothing, silently).
  for (const auto& mapped : options.device_map) {
    const std::string& prefix = mapped.first;  // a plain reference: clang 14 cannot capture a structured binding
    const bool places_something = std::any_of(model_state.begin(), model_state.end(), [&](const auto& entry) {
      return prefix_matches(prefix, entry.first);
    });
    TORCH_CHECK_VALUE(places_something, file.path(), ": device_map entry '", prefix,
                      "' matches no parameter or buffer of the model (prefixes are module paths such as '",
                      model_state.empty() ? std::string() : model_state.front().first.substr(0, model_state.front().first.find('.')),
                      "', or '' for all)");
  }
  // Model: every parameter and buffer placed on its mapped device in the policy's dtype.
  std::map<void*, at::Tensor> placed_by_impl;  // for the optimizer state, which follows its parameter
  std::map<std::string, std::string> applied;     // fp8 factor key -> the tensor widened with it
  for (const auto& [name, tensor] : model_state) {
    const at::Tensor saved = file.load("model." + name);
    const c10::Device device = device_for(name, placement, tensor.device());
    std::string factor;
    at::Tensor placed =
        widen(file, "model." + name, saved, dtype_for(saved, options, device), &factor).to(device, false, true);
    if (!factor.empty()) applied.emplace(factor, name);
    placed_by_impl[tensor.unsafeGetTensorImpl()] = placed;
    staged.model.emplace_back(tensor, std::move(placed));
  }
  // A widened fp8 tensor holds real values now; the model's own copy of its factor, applied again
  // by its forward, would scale them twice: it becomes 1.
  for (size_t i = 0; i < model_state.size(); ++i) {
    const auto widened = applied.find("model." + model_state[i].first);
    if (widened == applied.end()) continue;
    staged.model[i].second = at::ones_like(staged.model[i].second);
    TORCH_WARN(file.path(), ": dequantized '", widened->second, "' with '", model_state[i].first,
               "'; the model's copy of that factor is set to 1, so that a forward that applies it does not scale ",
               "the values twice");
  }
  // Optimizer: hyper-parameters per group, state per parameter beside where the parameter goes.
  const OptimizerCodec& codec = codec_for(optimizer);
  const auto& saved_groups = metadata.optimizer.at("groups");
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    staged.group_options.push_back(codec.group_from_json(optimizer.param_groups()[g].options(), saved_groups[g]));
  }
  const auto params = optimizer_params(optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto placed = placed_by_impl.find(params[i].unsafeGetTensorImpl());
    const at::Tensor& like = placed != placed_by_impl.end() ? placed->second : params[i];
    auto state = codec.decode_state(file, "optimizer." + std::to_string(i) + ".", like);
    if (state) staged.param_states.emplace_back(params[i].unsafeGetTensorImpl(), std::move(state));
  }
  // Generators: the ones saved that exist here, each state checked against the generator's own
  // size (set_state would raise halfway through the commit otherwise).
  if (options.restore_rng) {
    std::vector<std::pair<at::Generator, std::string>> wanted = {{at::detail::getDefaultCPUGenerator(), "rng.cpu"}};
    for (const auto& device : generator_devices()) {
      wanted.emplace_back(at::globalContext().defaultGenerator(device), "rng." + device.str());
    }
    for (const auto& [generator, key] : wanted) {
      if (!file.contains(key)) {
        TORCH_CHECK_VALUE(key != "rng.cpu", file.path(), ": the state has no CPU generator state 'rng.cpu'");
        continue;
      }
      const at::Tensor state = file.load(key);
      const int64_t expected = generator.get_state().numel();
      TORCH_CHECK_VALUE(state.scalar_type() == at::kByte && state.numel() == expected, file.path(), ": generator state '",
                        key, "' has ", state.numel(), " elements of ", state.scalar_type(), "; this generator's has ",
                        expected, " bytes");
      staged.generators.emplace_back(generator, state.clone());
    }
  }
  return staged;
}

// Applies a staged restore. Each step can fail only in torch (a set_data or set_state refusing);
// then every step already taken is undone, so the model, optimizer and generators are as before.
void commit(StagedRestore& staged, torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> old_model;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> old_options;
  std::vector<at::Tensor> old_generators;
  auto& state = optimizer.state();
  std::remove_reference_t<decltype(optimizer.state())> old_state;
  bool state_swapped = false;
  const auto set_generator = [](at::Generator& generator, const at::Tensor& value) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(value);
  };
  try {
    at::NoGradGuard no_grad;
    for (auto& [tensor, value] : staged.model) {
      old_model.push_back(tensor.data());
      tensor.set_data(value);
    }
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      old_options.push_back(groups[g].options().clone());
      groups[g].set_options(std::move(staged.group_options[g]));
    }
    old_state.swap(state);
    state_swapped = true;
    for (auto& [impl, param_state] : staged.param_states) state[impl] = std::move(param_state);
    for (auto& [generator, value] : staged.generators) {
      old_generators.push_back(generator.get_state());
      set_generator(generator, value);
    }
  } catch (...) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < old_model.size(); ++i) staged.model[i].first.set_data(old_model[i]);
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < old_options.size(); ++g) groups[g].set_options(std::move(old_options[g]));
    if (state_swapped) state.swap(old_state);
    for (size_t i = 0; i < old_generators.size(); ++i) set_generator(staged.generators[i].first, old_generators[i]);
    throw;
  }
}

TrainingProgress load_state_into(const std::string& path, const NamedTensors& model_state,
                                 torch::optim::Optimizer& optimizer, const RestoreOptions& options) {
  // An integer target reached a parameter's set_data, whose error names no option, file or key.
  TORCH_CHECK_VALUE(options.dtype_policy != DtypePolicy::kCastFloating || c10::isFloatingType(options.cast_to), path,
                    ": RestoreOptions::cast_to is ", c10::toString(options.cast_to),
                    "; kCastFloating casts floating-point tensors to a floating-point dtype");
  const auto file = SafetensorsFile::open(path);
  StagedRestore staged = stage(file, model_state, optimizer, options);
  commit(staged, optimizer);
  return staged.progress;
}

}  // namespace

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

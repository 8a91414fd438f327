#pragma once
// A training run's full state in one safetensors file: model parameters and buffers, optimizer
// state (SGD with momentum, Adam, AdamW: moment buffers, step counts, hyper-parameters), RNG
// states per backend, step/epoch counters, user metadata, and optionally a GradScaler's state and
// an LR scheduler's state (the Python side's save_training_state writes both). Restoring can place the model on
// other devices and change dtypes, so a run saved on one backend resumes on another.

#include <torchbridge/amp/grad_scaler_state.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace torch::jit {
struct Module;
}

namespace torchbridge::checkpoint {

struct TrainingProgress {
  int64_t step = 0;
  int64_t epoch = 0;
  std::map<std::string, std::string> user_metadata;
  // torch.amp.GradScaler's state_dict (amp::GradScaler::state_dict() gives it, load_state_dict
  // takes it): saved when set, set by a restore when the file holds one.
  std::optional<amp::GradScalerState> grad_scaler;
  // An LR scheduler's state_dict as JSON (an object), as Python's save_training_state writes it.
  // LibTorch's schedulers keep no state to save, so C++ only carries it: a restore returns what
  // the file holds (empty when none) and a save writes it back, so a run can pass through C++.
  std::string lr_scheduler;
};

enum class DtypePolicy {
  kKeep,                // load every tensor in its saved dtype
  kCastFloating,        // cast every floating-point tensor to RestoreOptions::cast_to
  kConvertUnsupported,  // only what the target device cannot hold (bf16 -> fp32 where bf16 is unsupported)
};

struct RestoreOptions {
  // Module-name prefix -> device; the longest matching prefix wins, "" matches everything.
  // Empty: every tensor goes where the model's parameters already are.
  std::vector<std::pair<std::string, c10::Device>> device_map;
  // Non-empty: ignore device_map and spread the model over this backend's devices ("auto").
  std::string auto_backend;
  DtypePolicy dtype_policy = DtypePolicy::kKeep;
  c10::ScalarType cast_to = c10::ScalarType::Float;
  bool restore_rng = true;  // restores the generators that exist here; others are skipped
};

// The "auto" device map: top-level modules (the first component of each tensor name), in order,
// go to `backend`'s devices, each device taking a share of the bytes proportional to its free
// memory. `tensor_bytes` lists (tensor name, bytes) in model order.
std::vector<std::pair<std::string, c10::Device>> auto_device_map(
    const std::vector<std::pair<std::string, int64_t>>& tensor_bytes, const std::string& backend);

// For torch::nn modules and TorchScript modules alike (the optimizer holds the module's parameters).
void save_training_state(const std::string& path, const torch::nn::Module& model,
                         const torch::optim::Optimizer& optimizer, const TrainingProgress& progress);
void save_training_state(const std::string& path, const torch::jit::Module& model,
                         const torch::optim::Optimizer& optimizer, const TrainingProgress& progress);

// Restores into `model` and `optimizer` (same architecture and optimizer type as saved; any
// mismatch raises naming the tensor or setting). Returns the saved progress.
TrainingProgress load_training_state(const std::string& path, torch::nn::Module& model,
                                     torch::optim::Optimizer& optimizer, const RestoreOptions& options = {});
TrainingProgress load_training_state(const std::string& path, torch::jit::Module& model,
                                     torch::optim::Optimizer& optimizer, const RestoreOptions& options = {});

}  // namespace torchbridge::checkpoint

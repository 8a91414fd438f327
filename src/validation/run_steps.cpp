#include "validation/run_steps.h"

#include <ATen/ATen.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/memory/activation_checkpoint.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/alignment.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <tuple>
#include <utility>

namespace torchbridge::validation {

std::vector<at::Tensor> place_inputs(const std::vector<at::Tensor>& inputs, c10::Device device,
                                     c10::ScalarType dtype) {
  // Copies, always: a model that changes its input in place (x.sub_(0.5)) changed the caller's
  // tensor and the input of every later run, the reference's among them (read by its own thread
  // at the same time), so correct backends failed.
  std::vector<at::Tensor> placed;
  for (const auto& input : inputs) {
    const c10::ScalarType placed_dtype = at::isFloatingType(input.scalar_type()) ? dtype : input.scalar_type();
    placed.push_back(input.to(device, placed_dtype, /*non_blocking=*/false, /*copy=*/true));
  }
  return placed;
}

at::Tensor weighted_loss(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& weights) {
  TORCH_CHECK(outputs.size() == weights.size(), "the model returned ", outputs.size(), " outputs in this run but ",
              weights.size(), " in the reference run");
  at::Tensor loss;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& output = outputs[i];
    if (!(at::isFloatingType(output.scalar_type()) || output.is_complex()) || !output.requires_grad()) continue;
    TORCH_CHECK(output.sizes() == weights[i].sizes(), "output ", i, " has shape ", output.sizes(),
                " in this run but ", weights[i].sizes(), " in the reference run");
    // A complex output's real and imaginary parts both weighted, so gradients through either are checked.
    const at::Tensor values = output.is_complex() ? at::view_as_real(output) : output;
    const at::Tensor weight = weights[i].to(values.device(), values.scalar_type());
    const at::Tensor term = (values * (output.is_complex() ? weight.unsqueeze(-1) : weight)).sum();
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

std::vector<at::Tensor> detached_cpu(const std::vector<at::Tensor>& tensors) {
  // No clone: the results are fresh tensors nothing else writes to (gradients are dropped from
  // the parameters below, not zeroed in place).
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().cpu());
  return out;
}

RunResult run_model(const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& forward,
                    const NamedTensors& state,
                    const std::vector<at::Tensor>& placed_inputs, const OutputWeights& weights,
                    bool checkpointed) {
  for (const auto& [name, p] : state) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  RunResult result;
  // A forward-only run (the determinism repeat) runs exactly as the first did, grad mode and
  // checkpointing included, only without the backward: under no_grad some modules take another
  // kernel (TransformerEncoderLayer's and MultiheadAttention's fast path in eval mode), whose
  // last bits differ, and a bitwise comparison with the first run called that nondeterminism.
  const auto outputs = checkpointed ? memory::checkpoint(forward, placed_inputs) : forward(placed_inputs);
  if (!weights) {
    result.outputs = detached_cpu(outputs);
    return result;
  }
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& output : outputs) shapes.push_back(output.sizes().vec());
  const at::Tensor loss = weighted_loss(outputs, weights(shapes));
  if (loss.defined()) loss.backward();
  result.outputs = detached_cpu(outputs);
  for (const auto& [name, p] : state) {
    if (p.requires_grad() && p.grad().defined()) result.gradients.emplace_back(name, p.grad().detach().cpu());
  }
  for (const auto& [name, p] : state) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();  // gradients are device memory too
  }
  return result;
}

namespace {

// A private file for one round trip, removed when done. /dev/shm when there is one: the writer
// fsyncs (its crash safety), which on a disk would time the disk rather than the round trip.
class TemporaryFile {
 public:
  TemporaryFile() {
    const std::filesystem::path shm = "/dev/shm";
    const auto directory = std::filesystem::is_directory(shm) && access(shm.c_str(), W_OK) == 0
                               ? shm
                               : std::filesystem::temp_directory_path();
    std::string pattern = (directory / "torchbridge-round-trip-XXXXXX").string();
    const int fd = mkstemp(pattern.data());
    TORCH_CHECK(fd >= 0, "cannot create a temporary file from ", pattern);
    close(fd);
    path_ = pattern;
  }
  ~TemporaryFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

std::map<std::string, at::Tensor> checkpoint_round_trip(const NamedTensors& state, c10::Device device) {
  // Tied weights are stored once, as a checkpoint holds them (the writer refuses shared storage).
  UntiedState untied = store_tied_once(state);
  NamedTensors unique;
  for (const auto& [name, tensor] : untied.stored) unique.emplace_back(name, tensor.detach());
  TemporaryFile file;
  checkpoint::save(file.path(), unique);
  const auto reader = checkpoint::SafetensorsFile::open(file.path());
  // The reader maps the file, so its name can go now: a validator killed while loading (the long
  // part, onto a device) leaves no model-sized file in /dev/shm, which is memory.
  std::filesystem::remove(file.path());
  std::map<std::string, at::Tensor> loaded;
  for (const auto& [name, tensor] : unique) {
    at::Tensor value = reader.load(name, device);
    // On the CPU the reader aliases the mapping wherever the data is aligned for its dtype, but
    // torch allocates at 64 bytes, and its CPU kernels choose code paths by alignment: builtin:mlp
    // at batch 1 gave results 1.5e-8 apart from bit-identical weights at 48 mod 64, and its
    // round trip failed. The check is about the checkpoint, so the weights get torch's alignment.
    if (value.is_cpu() && reinterpret_cast<uintptr_t>(value.data_ptr()) % c10::gAlignment != 0) value = value.clone();
    loaded[name] = value;
  }
  for (const auto& [alias, stored] : untied.tied) loaded[alias] = loaded.at(stored);
  return loaded;
}

void assign(const NamedTensors& state, const std::map<std::string, at::Tensor>& values) {
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : state) {
    const auto it = values.find(name);
    TORCH_CHECK(it != values.end(), "the reloaded checkpoint has no tensor '", name, "'");
    at::Tensor target = tensor;
    target.set_data(it->second);
  }
}

}  // namespace torchbridge::validation

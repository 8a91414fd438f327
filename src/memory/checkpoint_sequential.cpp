// Checkpointing chains of modules (checkpoint_sequential.h).
#include <torchbridge/memory/checkpoint_sequential.h>

#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <memory>
#include <vector>

namespace torchbridge::memory {
namespace {

// Runs modules [begin, end) of the chain on x.
at::Tensor run_range(torch::nn::Sequential modules, size_t begin, size_t end, at::Tensor x) {
  for (auto module = modules->begin() + static_cast<std::ptrdiff_t>(begin);
       module != modules->begin() + static_cast<std::ptrdiff_t>(end); ++module) {
    x = module->forward(x);
  }
  return x;
}

// One checkpointed segment. The closure holds the Sequential (a shared handle), so the graph keeps
// the modules alive until backward even if the caller drops them.
at::Tensor checkpointed_range(const torch::nn::Sequential& modules, size_t begin, size_t end, const at::Tensor& x,
                              const CheckpointOptions& options) {
  torch::nn::Sequential chain = modules;
  return checkpoint([chain, begin, end](const at::Tensor& in) { return run_range(chain, begin, end, in); }, x,
                    options);
}

}  // namespace

at::Tensor checkpoint_sequential(const torch::nn::Sequential& modules, int64_t segments, const at::Tensor& input,
                                 const CheckpointOptions& options) {
  TORCH_CHECK_VALUE(!modules.is_empty(), "checkpoint_sequential: no Sequential was given");
  const auto count = static_cast<int64_t>(modules->size());
  TORCH_CHECK_VALUE(segments >= 1 && segments <= count, "checkpoint_sequential: segments must be between 1 and the "
                    "number of modules (", count, "), got ", segments);
  const auto segment_size = static_cast<size_t>(count / segments);
  at::Tensor x = input;
  size_t begin = 0;
  for (int64_t segment = 0; segment + 1 < segments; ++segment, begin += segment_size) {
    x = checkpointed_range(modules, begin, begin + segment_size, x, options);
  }
  return run_range(modules, begin, static_cast<size_t>(count), x);
}

CheckpointedSequentialImpl::CheckpointedSequentialImpl(torch::nn::Sequential modules, int64_t blocks_per_checkpoint,
                                                       CheckpointOptions options)
    : modules_(std::move(modules)), blocks_per_checkpoint_(blocks_per_checkpoint), options_(options) {
  TORCH_CHECK_VALUE(!modules_.is_empty(), "CheckpointedSequential: no Sequential was given");
  TORCH_CHECK_VALUE(blocks_per_checkpoint_ >= 1, "CheckpointedSequential: blocks_per_checkpoint must be at least 1, "
                    "got ", blocks_per_checkpoint_);
  // The wrapped modules become this module's children under their own names ("0", "1", ...), so
  // parameter names and state dicts are those of the plain Sequential.
  for (const auto& child : modules_->named_children()) register_module(child.key(), child.value());
}

void CheckpointedSequentialImpl::reset() {
  // Called by clone() only: the copy gets its own modules.
  modules_ = torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(modules_->clone()));
  for (const auto& child : modules_->named_children()) register_module(child.key(), child.value());
}

at::Tensor CheckpointedSequentialImpl::forward(const at::Tensor& input) {
  const size_t count = modules_->size();
  if (!is_training() || !torch::autograd::GradMode::is_enabled() || c10::InferenceMode::is_enabled()) {
    return run_range(modules_, 0, count, input);
  }
  at::Tensor x = input;
  const auto step = static_cast<size_t>(blocks_per_checkpoint_);
  size_t begin = 0;
  for (; begin + step < count; begin += step) x = checkpointed_range(modules_, begin, begin + step, x, options_);
  // The last group runs plainly: backward needs its activations as soon as it starts, so
  // checkpointing it would only add a recomputation.
  return run_range(modules_, begin, count, x);
}

}  // namespace torchbridge::memory

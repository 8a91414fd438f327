#pragma once
// Checkpointing a chain of modules (torch.utils.checkpoint.checkpoint_sequential for LibTorch):
// the chain is cut into segments, each checkpointed segment keeps only its input alive until
// backward, and recomputes its inner activations then.

#include <torchbridge/memory/activation_checkpoint.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace torchbridge::memory {

// torch.utils.checkpoint.checkpoint_sequential's contract: `segments` segments of
// size(modules) / segments modules each, all checkpointed except the last, which runs plainly
// (with any remainder), because its activations are needed at once by the backward pass anyway.
// Raises c10::ValueError when segments is not between 1 and the number of modules.
at::Tensor checkpoint_sequential(const torch::nn::Sequential& modules, int64_t segments, const at::Tensor& input,
                                 const CheckpointOptions& options = {});

// A Sequential whose forward checkpoints each group of `blocks_per_checkpoint` consecutive modules
// but the last while training with grad enabled (the last group's activations are needed as soon as
// backward starts, so checkpointing it would only cost time). In eval mode or without grad it runs
// the modules plainly: there is no backward to save memory for. Its parameters are the wrapped modules' (same names, so state
// dicts load unchanged).
class CheckpointedSequentialImpl : public torch::nn::Cloneable<CheckpointedSequentialImpl> {
 public:
  CheckpointedSequentialImpl(torch::nn::Sequential modules, int64_t blocks_per_checkpoint,
                             CheckpointOptions options = {});

  void reset() override;
  at::Tensor forward(const at::Tensor& input);

  const torch::nn::Sequential& modules() const { return modules_; }
  int64_t blocks_per_checkpoint() const { return blocks_per_checkpoint_; }

 private:
  torch::nn::Sequential modules_;
  int64_t blocks_per_checkpoint_;
  CheckpointOptions options_;
};
TORCH_MODULE(CheckpointedSequential);

}  // namespace torchbridge::memory

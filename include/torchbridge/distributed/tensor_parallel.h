#pragma once
// Tensor parallelism in the Megatron-LM layout: one layer's weight split across the ranks of a
// group, each rank computing its slice, with the collectives placed so forward and backward are
// the unsplit layer's.
//   ColumnParallelLinear  rows of W (output features) per rank: y_r = x W_r^T + b_r. The input is
//                         replicated, so its gradient is all-reduced in backward.
//   RowParallelLinear     columns of W (input features) per rank, on an input split the same way
//                         (a column-parallel layer's output): y = sum_r x_r W_r^T + b, the sum an
//                         all-reduce in forward.
//   ParallelMLP           column-parallel up projection, GELU, row-parallel down projection: one
//                         all-reduce in forward, one in backward.
//   ParallelSelfAttention the heads split across ranks (q, k, v column-parallel by head), each
//                         rank attends with its heads, the output projection row-parallel.
// Each is built from the unsplit torch::nn layer, each rank taking its own slice of rank 0's
// parameters (broadcast when the layer is built, as torch's ColwiseParallel and RowwiseParallel
// distribute rank 0's: a rank seeded differently would otherwise slice another layer): outputs
// and gradients equal rank 0's unsplit layer's. A dimension the group's size does not divide is a
// c10::ValueError naming it, and so is a MultiheadAttention option the split cannot reproduce
// (add_bias_kv, add_zero_attn, attention dropout). Layers on the CPU or an SDK device: the
// collectives run on Gloo, an SDK device's tensors through host copies.

#include <torchbridge/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>

namespace torchbridge::distributed {

// The three collectives of the layout, as autograd functions (Megatron's f, g and gather):
// identity forward, all-reduce of the gradient backward (where a replicated input enters a split
// computation);
at::Tensor copy_to_tensor_parallel(const at::Tensor& input, const std::shared_ptr<ProcessGroup>& group);
// all-reduce forward, identity backward (where split partial sums leave it);
at::Tensor reduce_from_tensor_parallel(const at::Tensor& partial, const std::shared_ptr<ProcessGroup>& group);
// every rank's slice concatenated along the last dimension, forward; this rank's slice of the
// gradient, backward.
at::Tensor gather_from_tensor_parallel(const at::Tensor& slice, const std::shared_ptr<ProcessGroup>& group);

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // gather_output: return the whole output on every rank (else this rank's out_features/world
  // columns, for a RowParallelLinear to take).
  ColumnParallelLinearImpl(const torch::nn::Linear& full, std::shared_ptr<ProcessGroup> group, bool gather_output);
  at::Tensor forward(const at::Tensor& input);

  at::Tensor weight;  // [out_features / world, in_features]
  at::Tensor bias;    // [out_features / world], undefined without bias

 private:
  std::shared_ptr<ProcessGroup> group_;
  bool gather_output_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(const torch::nn::Linear& full, std::shared_ptr<ProcessGroup> group);
  // input: this rank's in_features/world columns -> the whole output, on every rank
  at::Tensor forward(const at::Tensor& input);

  at::Tensor weight;  // [out_features, in_features / world]
  at::Tensor bias;    // [out_features], whole on every rank, added once after the sum

 private:
  std::shared_ptr<ProcessGroup> group_;
};
TORCH_MODULE(RowParallelLinear);

class ParallelMLPImpl : public torch::nn::Module {
 public:
  // up: Linear(h, f), down: Linear(f, h); f must divide by the group's size. GELU between them.
  ParallelMLPImpl(const torch::nn::Linear& up, const torch::nn::Linear& down, std::shared_ptr<ProcessGroup> group);
  at::Tensor forward(const at::Tensor& input);

  ColumnParallelLinear up = nullptr;
  RowParallelLinear down = nullptr;
};
TORCH_MODULE(ParallelMLP);

class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  // torch::nn::MultiheadAttention with q, k and v of one size (its in_proj_weight), no bias_k/v,
  // no dropout; its heads must divide by the group's size.
  ParallelSelfAttentionImpl(const torch::nn::MultiheadAttention& full, std::shared_ptr<ProcessGroup> group);
  // x: [sequence, batch, embed] (MultiheadAttention's layout) -> the same shape, whole on every rank
  at::Tensor forward(const at::Tensor& x);

  at::Tensor qkv_weight;  // [3 * local_heads * head_dim, embed]: this rank's rows of q, k and v
  at::Tensor qkv_bias;
  RowParallelLinear out = nullptr;
  int64_t local_heads = 0;
  int64_t head_dim = 0;

 private:
  std::shared_ptr<ProcessGroup> group_;
};
TORCH_MODULE(ParallelSelfAttention);

}  // namespace torchbridge::distributed

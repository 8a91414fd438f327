#include <torchbridge/distributed/tensor_parallel.h>

#include "distributed/host_staging.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels to backward in the context's saved data, which holds IValues: a capsule
// keeps the shared_ptr (and so the group) alive as long as the graph needs it.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<ProcessGroup> group) : group(std::move(group)) {}
  std::shared_ptr<ProcessGroup> group;
};

void save_group(AutogradContext* ctx, const std::shared_ptr<ProcessGroup>& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
}

ProcessGroup& saved_group(AutogradContext* ctx) {
  const auto capsule = ctx->saved_data["group"].toCapsule();
  return *static_cast<GroupCapsule*>(capsule.get())->group;
}

// A summed copy: gradients and partial sums are not ours to change in place. An SDK device's
// tensor goes through host memory: Gloo takes CPU tensors only.
at::Tensor all_reduced(ProcessGroup& group, const at::Tensor& tensor) {
  at::Tensor sum = tensor.is_cpu() ? tensor.contiguous().clone() : tensor.to(at::kCPU).contiguous();
  group.all_reduce_sum(sum);
  return tensor.is_cpu() ? sum : sum.to(tensor.device());
}

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const std::shared_ptr<ProcessGroup>& group) {
    save_group(ctx, group);
    return input;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(saved_group(ctx), grads[0]), at::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& partial,
                            const std::shared_ptr<ProcessGroup>& group) {
    return all_reduced(*group, partial);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherFromParallel : torch::autograd::Function<GatherFromParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& slice, const std::shared_ptr<ProcessGroup>& group) {
    save_group(ctx, group);
    return at::cat(group->all_gather(slice.to(at::kCPU).contiguous()), -1).to(slice.device());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ProcessGroup& group = saved_group(ctx);
    return {grads[0].chunk(group.world_size(), -1)[group.rank()].contiguous(), at::Tensor()};
  }
};

std::shared_ptr<ProcessGroup> checked(std::shared_ptr<ProcessGroup> group, const char* layer) {
  TORCH_CHECK_VALUE(group != nullptr, layer, " needs a process group (torchbridge::distributed::init())");
  return group;
}

// The size of this rank's share of `size`; a size the group does not divide is refused naming it.
int64_t share_of(int64_t size, const ProcessGroup& group, const char* layer, const char* what) {
  TORCH_CHECK_VALUE(size % group.world_size() == 0, layer, ": ", what, " ", size, " does not divide into ",
                    group.world_size(), " equal shares, one per rank of the tensor-parallel group");
  return size / group.world_size();
}

// Gloo reduces CPU tensors; an SDK device's go through host memory. CUDA layers would want their
// partial sums on NCCL, which these layers do not use yet.
void check_device(const at::Tensor& weight, const char* layer) {
  TORCH_CHECK_VALUE(weight.is_cpu() || weight.is_privateuseone(), layer,
                    " runs its collectives on Gloo: CPU tensors, or an SDK device's through host memory (tensor "
                    "parallel over NCCL is not built); the layer is on ", weight.device());
}

// Rank 0's values of `tensor` (a copy: the caller's layer is not changed). Each rank slices its
// share of the full layer it was given, which makes one layer only when every rank was given the
// same one.
at::Tensor rank_zero_copy(const at::Tensor& tensor, ProcessGroup& group) {
  const std::vector<at::Tensor> copy{tensor.detach().clone()};
  broadcast_through_host(group, copy, 0);
  return copy.front();
}

// This rank's rows [rank * rows, (rank + 1) * rows) of each of `blocks` equal blocks of `full`'s
// first dimension (q, k and v are three blocks of in_proj_weight), concatenated.
at::Tensor rows_of(const at::Tensor& full, int64_t blocks, int64_t rows, int rank) {
  std::vector<at::Tensor> parts;
  const int64_t block = full.size(0) / blocks;
  for (int64_t b = 0; b < blocks; ++b) parts.push_back(full.detach().narrow(0, b * block + rank * rows, rows));
  return at::cat(parts, 0).clone();
}

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& input, const std::shared_ptr<ProcessGroup>& group) {
  return CopyToParallel::apply(input, checked(group, "copy_to_tensor_parallel"));
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& partial, const std::shared_ptr<ProcessGroup>& group) {
  return ReduceFromParallel::apply(partial, checked(group, "reduce_from_tensor_parallel"));
}

at::Tensor gather_from_tensor_parallel(const at::Tensor& slice, const std::shared_ptr<ProcessGroup>& group) {
  return GatherFromParallel::apply(slice, checked(group, "gather_from_tensor_parallel"));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::Linear& full, std::shared_ptr<ProcessGroup> group,
                                                   bool gather_output)
    : group_(checked(std::move(group), "ColumnParallelLinear")), gather_output_(gather_output) {
  check_device(full->weight, "ColumnParallelLinear");
  const int64_t rows = share_of(full->weight.size(0), *group_, "ColumnParallelLinear", "out_features");
  weight = register_parameter("weight", rows_of(rank_zero_copy(full->weight, *group_), 1, rows, group_->rank()));
  if (full->bias.defined()) {
    bias = register_parameter("bias", rank_zero_copy(full->bias, *group_).narrow(0, group_->rank() * rows, rows).clone());
  }
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor local = at::linear(copy_to_tensor_parallel(input, group_), weight, bias);
  return gather_output_ ? gather_from_tensor_parallel(local, group_) : local;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::Linear& full, std::shared_ptr<ProcessGroup> group)
    : group_(checked(std::move(group), "RowParallelLinear")) {
  check_device(full->weight, "RowParallelLinear");
  const int64_t columns = share_of(full->weight.size(1), *group_, "RowParallelLinear", "in_features");
  weight = register_parameter(
      "weight", rank_zero_copy(full->weight, *group_).narrow(1, group_->rank() * columns, columns).clone());
  // Every rank adds the whole bias after the all-reduce: ranks with different biases would give
  // different outputs.
  if (full->bias.defined()) bias = register_parameter("bias", rank_zero_copy(full->bias, *group_));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor sum = reduce_from_tensor_parallel(at::linear(input, weight), group_);
  return bias.defined() ? sum + bias : sum;
}

ParallelMLPImpl::ParallelMLPImpl(const torch::nn::Linear& up_full, const torch::nn::Linear& down_full,
                                 std::shared_ptr<ProcessGroup> group) {
  TORCH_CHECK_VALUE(up_full->weight.size(0) == down_full->weight.size(1), "ParallelMLP: the up projection's ",
                    up_full->weight.size(0), " outputs do not feed the down projection's ", down_full->weight.size(1),
                    " inputs");
  up = register_module("up", ColumnParallelLinear(up_full, group, /*gather_output=*/false));
  down = register_module("down", RowParallelLinear(down_full, std::move(group)));
}

at::Tensor ParallelMLPImpl::forward(const at::Tensor& input) { return down->forward(at::gelu(up->forward(input))); }

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(const torch::nn::MultiheadAttention& full,
                                                     std::shared_ptr<ProcessGroup> group)
    : group_(checked(std::move(group), "ParallelSelfAttention")) {
  TORCH_CHECK_VALUE(full->_qkv_same_embed_dim && full->in_proj_weight.defined(),
                    "ParallelSelfAttention takes a MultiheadAttention whose q, k and v have the embedding's size");
  TORCH_CHECK_VALUE(!full->bias_k.defined() && !full->bias_v.defined(),
                    "ParallelSelfAttention does not take add_bias_kv");
  TORCH_CHECK_VALUE(!full->options.add_zero_attn(), "ParallelSelfAttention does not take add_zero_attn (its forward ",
                    "attends without the zero key and value MultiheadAttention would add)");
  TORCH_CHECK_VALUE(full->options.dropout() == 0.0, "ParallelSelfAttention does not take attention dropout (got ",
                    full->options.dropout(), ")");
  check_device(full->in_proj_weight, "ParallelSelfAttention");
  local_heads = share_of(full->options.num_heads(), *group_, "ParallelSelfAttention", "num_heads");
  head_dim = full->head_dim;
  const int64_t rows = local_heads * head_dim;
  qkv_weight = register_parameter("qkv_weight",
                                  rows_of(rank_zero_copy(full->in_proj_weight, *group_), 3, rows, group_->rank()));
  if (full->in_proj_bias.defined()) {
    qkv_bias = register_parameter("qkv_bias",
                                  rows_of(rank_zero_copy(full->in_proj_bias, *group_), 3, rows, group_->rank()));
  }
  out = register_module("out", RowParallelLinear(full->out_proj, group_));
}

at::Tensor ParallelSelfAttentionImpl::forward(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() == 3, "ParallelSelfAttention takes [sequence, batch, embed], got ", x.sizes());
  const int64_t length = x.size(0), batch = x.size(1);
  const auto qkv = at::linear(copy_to_tensor_parallel(x, group_), qkv_weight, qkv_bias).chunk(3, -1);
  // As MultiheadAttention lays heads out: [length, batch * heads, head_dim], then batch-major.
  const auto heads = [&](const at::Tensor& t) {
    return t.contiguous().view({length, batch * local_heads, head_dim}).transpose(0, 1);
  };
  const at::Tensor q = heads(qkv[0]) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
  const at::Tensor weights = at::softmax(at::bmm(q, heads(qkv[1]).transpose(1, 2)), -1);
  const at::Tensor attended = at::bmm(weights, heads(qkv[2])).transpose(0, 1).contiguous().view(
      {length, batch, local_heads * head_dim});
  return out->forward(attended);
}

}  // namespace torchbridge::distributed

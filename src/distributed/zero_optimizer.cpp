#include <torchbridge/distributed/zero_optimizer.h>

#include "distributed/host_staging.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

int64_t bytes_of(const at::Tensor& tensor) { return tensor.defined() ? static_cast<int64_t>(tensor.nbytes()) : 0; }

// Largest parameters first, each to the rank with the fewest bytes so far (the lowest rank on
// ties): the same answer on every rank, and shards within one parameter's size of each other.
std::vector<int> assign_owners(const std::vector<at::Tensor>& parameters, int world_size) {
  std::vector<size_t> order(parameters.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return parameters[a].nbytes() > parameters[b].nbytes(); });
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owners(parameters.size(), 0);
  for (const size_t index : order) {
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    owners[index] = static_cast<int>(lightest);
    load[static_cast<size_t>(lightest)] += static_cast<int64_t>(parameters[index].nbytes());
  }
  return owners;
}

// Adam's and AdamW's per-parameter state: a step count and two (three with amsgrad) moments.
// Both state classes have these fields under the same names.
struct MomentState {
  int64_t step = 0;
  at::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
};

template <typename State>
bool read_moments(const torch::optim::OptimizerParamState& state, MomentState& out) {
  const auto* typed = dynamic_cast<const State*>(&state);
  if (typed == nullptr) return false;
  out = {typed->step(), typed->exp_avg(), typed->exp_avg_sq(), typed->max_exp_avg_sq()};
  return true;
}

MomentState moments_of(const torch::optim::OptimizerParamState& state) {
  MomentState moments;
  TORCH_CHECK_NOT_IMPLEMENTED(read_moments<torch::optim::AdamParamState>(state, moments) ||
                                  read_moments<torch::optim::AdamWParamState>(state, moments),
                              "ZeroRedundancyOptimizer gathers and restores the state of Adam and AdamW, not ",
                              typeid(state).name());
  return moments;
}

// A state object of the optimizer's own kind holding `moments`.
std::unique_ptr<torch::optim::OptimizerParamState> state_for(const torch::optim::Optimizer& optimizer,
                                                             const MomentState& moments) {
  const auto fill = [&moments](auto state) {
    state->step(moments.step);
    state->exp_avg(moments.exp_avg);
    state->exp_avg_sq(moments.exp_avg_sq);
    if (moments.max_exp_avg_sq.defined()) state->max_exp_avg_sq(moments.max_exp_avg_sq);
    return state;
  };
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) {
    return fill(std::make_unique<torch::optim::AdamParamState>());
  }
  TORCH_CHECK_NOT_IMPLEMENTED(dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr,
                              "ZeroRedundancyOptimizer gathers and restores the state of Adam and AdamW only");
  return fill(std::make_unique<torch::optim::AdamWParamState>());
}

void* key_of(const at::Tensor& parameter) { return parameter.unsafeGetTensorImpl(); }

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> parameters,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 const OptimizerFactory& make_optimizer)
    : group_(std::move(group)), parameters_(std::move(parameters)) {
  TORCH_CHECK_VALUE(group_ != nullptr,
                    "ZeroRedundancyOptimizer needs a process group (torchbridge::distributed::init())");
  TORCH_CHECK_VALUE(!parameters_.empty(), "ZeroRedundancyOptimizer was given no parameters");
  TORCH_CHECK_VALUE(static_cast<bool>(make_optimizer), "ZeroRedundancyOptimizer needs a function that makes the "
                                                       "optimizer for this rank's parameters");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TORCH_CHECK_VALUE(parameters_[i].defined(), "ZeroRedundancyOptimizer: parameter ", i, " is an undefined tensor");
    check_collective_device(*group_, parameters_[i].device(), "ZeroRedundancyOptimizer");
  }
  owners_ = assign_owners(parameters_, group_->world_size());
  by_owner_.resize(static_cast<size_t>(group_->world_size()));
  for (size_t i = 0; i < parameters_.size(); ++i) by_owner_[static_cast<size_t>(owners_[i])].push_back(parameters_[i]);
  const auto& mine = by_owner_[static_cast<size_t>(group_->rank())];
  if (!mine.empty()) {
    local_ = make_optimizer(mine);
    TORCH_CHECK_VALUE(local_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned null");
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::zero_grad() {
  for (auto& parameter : parameters_) {
    if (parameter.grad().defined()) parameter.mutable_grad().reset();  // as Optimizer::zero_grad(set_to_none)
  }
}

void ZeroRedundancyOptimizer::step() {
  if (local_) local_->step();
  for (int owner = 0; owner < group_->world_size(); ++owner) {
    const auto& shard = by_owner_[static_cast<size_t>(owner)];
    if (!shard.empty()) broadcast_through_host(*group_, shard, owner);
  }
}

void ZeroRedundancyOptimizer::consolidate_state_into(torch::optim::Optimizer* full, int root) {
  TORCH_CHECK_VALUE(root >= 0 && root < group_->world_size(), "consolidate_state_into: root ", root,
                    " is not a rank of this world (0..", group_->world_size() - 1, ")");
  TORCH_CHECK_VALUE(group_->rank() != root || full != nullptr,
                    "consolidate_state_into: rank ", root, " (the root) must pass the optimizer to fill");
  const bool amsgrad = [&] {
    // Whether the third moment travels: every rank must agree, so ask the first state found on
    // rank 0's side of the exchange (every shard's optimizer was made by the same factory).
    at::Tensor flag = at::zeros({1}, at::kLong);
    if (local_) {
      for (const auto& [key, state] : local_->state()) {
        flag.fill_(moments_of(*state).max_exp_avg_sq.defined() ? 1 : 0);
        break;
      }
    }
    group_->all_reduce_sum(flag);
    return flag.item<int64_t>() > 0;
  }();
  // Per owner, one coalesced broadcast of [step, exp_avg, exp_avg_sq(, max_exp_avg_sq)] for each
  // of its parameters; a parameter not stepped yet travels as step 0 and is left without state.
  for (int owner = 0; owner < group_->world_size(); ++owner) {
    std::vector<size_t> indices;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (owners_[i] == owner) indices.push_back(i);
    }
    std::vector<at::Tensor> tensors;
    for (const size_t i : indices) {
      const auto& parameter = parameters_[i];
      MomentState moments;
      const bool mine = owner == group_->rank();
      if (mine) {
        const auto found = local_->state().find(key_of(parameter));
        if (found != local_->state().end()) moments = moments_of(*found->second);
      }
      tensors.push_back(at::full({1}, moments.step, at::kLong));
      tensors.push_back(mine && moments.exp_avg.defined() ? moments.exp_avg.detach() : at::zeros_like(parameter));
      tensors.push_back(mine && moments.exp_avg_sq.defined() ? moments.exp_avg_sq.detach() : at::zeros_like(parameter));
      if (amsgrad) {
        tensors.push_back(mine && moments.max_exp_avg_sq.defined() ? moments.max_exp_avg_sq.detach()
                                                                   : at::zeros_like(parameter));
      }
    }
    if (tensors.empty()) continue;
    if (owner != group_->rank()) {
      for (auto& tensor : tensors) tensor = tensor.clone();  // receive into buffers of our own
    }
    broadcast_through_host(*group_, tensors, owner);
    if (group_->rank() != root) continue;
    const size_t per = amsgrad ? 4 : 3;
    for (size_t k = 0; k < indices.size(); ++k) {
      MomentState moments{tensors[k * per].item<int64_t>(), tensors[k * per + 1].clone(),
                          tensors[k * per + 2].clone(), amsgrad ? tensors[k * per + 3].clone() : at::Tensor()};
      const auto key = key_of(parameters_[indices[k]]);
      if (moments.step == 0) {
        full->state().erase(key);  // not stepped yet: no state, as in the shard
        continue;
      }
      full->state()[key] = state_for(*full, moments);
    }
  }
  // The hyperparameters the shards step with (a scheduler's learning rate included), as torch's
  // ZeroRedundancyOptimizer carries its param_groups into the consolidated state. Every shard's
  // optimizer came from the same factory and is adjusted alike, so the root's own tells.
  if (group_->rank() == root && local_ && !local_->param_groups().empty()) {
    for (auto& full_group : full->param_groups()) {
      full_group.set_options(local_->param_groups().front().options().clone());
    }
  }
}

void ZeroRedundancyOptimizer::load_state_from(const torch::optim::Optimizer& full) {
  if (!local_) return;
  // The shard steps with the hyperparameters of the group in `full` that holds its first
  // parameter (a restored learning rate included), as torch's load_state_dict restores them.
  const at::Tensor& first = by_owner_[static_cast<size_t>(group_->rank())].front();
  for (const auto& full_group : full.param_groups()) {
    const auto& held = full_group.params();
    if (std::none_of(held.begin(), held.end(), [&](const at::Tensor& p) { return p.is_same(first); })) continue;
    for (auto& local_group : local_->param_groups()) local_group.set_options(full_group.options().clone());
    break;
  }
  for (const auto& parameter : by_owner_[static_cast<size_t>(group_->rank())]) {
    const auto found = full.state().find(key_of(parameter));
    if (found == full.state().end()) {
      local_->state().erase(key_of(parameter));  // no state in `full`: none left from before either
      continue;
    }
    MomentState moments = moments_of(*found->second);
    moments.exp_avg = moments.exp_avg.clone();
    moments.exp_avg_sq = moments.exp_avg_sq.clone();
    if (moments.max_exp_avg_sq.defined()) moments.max_exp_avg_sq = moments.max_exp_avg_sq.clone();
    local_->state()[key_of(parameter)] = state_for(*local_, moments);
  }
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const { return local_ ? optimizer_state_bytes(*local_) : 0; }

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state.get())) {
      total += bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) + bytes_of(adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      total += bytes_of(adamw->exp_avg()) + bytes_of(adamw->exp_avg_sq()) + bytes_of(adamw->max_exp_avg_sq());
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      total += bytes_of(sgd->momentum_buffer());
    } else {
      const torch::optim::OptimizerParamState& unknown = *state;
      TORCH_CHECK_NOT_IMPLEMENTED(false, "optimizer_state_bytes knows the state of SGD, Adam and AdamW, not ",
                                  typeid(unknown).name());
    }
  }
  return total;
}

}  // namespace torchbridge::distributed

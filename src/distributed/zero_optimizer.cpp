#include <torchbridge/distributed/zero_optimizer.h>

#include "distributed/failure_cause.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <exception>
#include <numeric>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

// Coalescing buffer for the parameter exchange, as DistributedDataParallel broadcasts state.
constexpr size_t kBroadcastBytes = 250u << 20;

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
    TORCH_CHECK_VALUE(parameters_[i].defined() && parameters_[i].is_cpu(),
                      "ZeroRedundancyOptimizer exchanges parameters over Gloo: parameter ", i,
                      " must be a CPU tensor, got ",
                      parameters_[i].defined() ? parameters_[i].device().str() : std::string("an undefined tensor"));
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
  try {
    const at::NoGradGuard no_grad;
    for (int owner = 0; owner < group_->world_size(); ++owner) {
      auto& shard = by_owner_[static_cast<size_t>(owner)];
      if (shard.empty()) continue;
      std::vector<at::Tensor> tensors;
      for (const auto& parameter : shard) tensors.push_back(parameter.detach());
      c10d::broadcast_coalesced(group_->native(), tensors, kBroadcastBytes, owner);
    }
  } catch (const std::exception& e) {
    group_->raise_failure("ZeroRedundancyOptimizer exchanging the stepped parameters", failure_cause(e));
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
      TORCH_CHECK_NOT_IMPLEMENTED(false, "optimizer_state_bytes knows the state of SGD, Adam and AdamW, not ",
                                  typeid(*state).name());
    }
  }
  return total;
}

}  // namespace torchbridge::distributed

#include <torchbridge/distributed/data_parallel.h>

#include "distributed/failure_cause.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

// DistributedDataParallel's broadcast buffer for the initial state.
constexpr size_t kBroadcastBytes = 250u << 20;

// Runs a step that drives c10d directly; a failure becomes the group's error, naming the lost rank.
template <typename Step>
void named(const ProcessGroup& group, const std::string& what, const Step& step) {
  try {
    step();
  } catch (const std::exception& e) {
    group.raise_failure("DataParallel " + what, failure_cause(e));
  }
}

}  // namespace

namespace {

ModelTensors tensors_of(torch::nn::Module& module) {
  ModelTensors tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) tensors.parameters.emplace_back(item.key(), item.value());
  tensors.buffers = module.buffers(/*recurse=*/true);
  return tensors;
}

}  // namespace

DataParallel::DataParallel(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group,
                           DataParallelOptions options)
    : DataParallel(tensors_of(module), std::move(group), options) {}

DataParallel::DataParallel(const ModelTensors& model, std::shared_ptr<ProcessGroup> group,
                           DataParallelOptions options)
    : group_(std::move(group)) {
  TORCH_CHECK_VALUE(group_ != nullptr, "DataParallel needs a process group (torchbridge::distributed::init())");
  TORCH_CHECK_VALUE(options.bucket_bytes > 0 && options.first_bucket_bytes > 0,
                    "DataParallel bucket sizes must be positive, got bucket_bytes ", options.bucket_bytes,
                    " and first_bucket_bytes ", options.first_bucket_bytes);
  std::unordered_map<size_t, std::string> names;
  for (const auto& [name, parameter] : model.parameters) {
    if (!parameter.requires_grad()) continue;
    TORCH_CHECK_VALUE(parameter.is_cpu(), "DataParallel runs on Gloo with CPU parameters for now; parameter '", name,
                      "' is on ", parameter.device());
    names.emplace(parameters_.size(), name);
    parameters_.push_back(parameter);
  }
  TORCH_CHECK_VALUE(!parameters_.empty(), "DataParallel: the module has no parameter that requires a gradient");
  const auto& native = group_->native();

  // A different model on some rank would otherwise fail later, somewhere in a collective. c10d's
  // check raises only on the ranks that differ from rank 0; the outcome is then shared, so every
  // rank refuses, naming the ranks that differ.
  std::string mismatch;
  try {
    c10d::verify_params_across_processes(native, parameters_, std::nullopt);
  } catch (const c10::Error& e) {
    mismatch = e.msg();
  }
  std::vector<int64_t> differing;
  const auto outcomes = group_->all_gather(at::full({1}, mismatch.empty() ? 0 : 1, at::kInt));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].item<int>() != 0) differing.push_back(static_cast<int64_t>(r));
  }
  TORCH_CHECK_VALUE(differing.empty(), "DataParallel, rank ", group_->rank(), " of ", group_->world_size(), ": the model differs across ranks (ranks ",
                    c10::IntArrayRef(differing), " do not match rank 0's parameter shapes)",
                    mismatch.empty() ? std::string() : ": " + mismatch);
  std::vector<at::Tensor> state;
  for (const auto& p : parameters_) state.push_back(p.detach());
  for (const auto& b : model.buffers) state.push_back(b.detach());
  named(*group_, "broadcasting rank 0's parameters and buffers", [&] {
    const at::NoGradGuard no_grad;
    c10d::broadcast_coalesced(native, state, kBroadcastBytes, 0);
  });

  // Buckets in reverse registration order (the order backward produces gradients in), as
  // DistributedDataParallel assigns them: a small first bucket, then bucket_bytes each.
  const std::vector<size_t> limits = {static_cast<size_t>(options.first_bucket_bytes),
                                      static_cast<size_t>(options.bucket_bytes)};
  auto [buckets, bucket_limits] = c10d::compute_bucket_assignment_by_size(parameters_, limits);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(bucket_limits.begin(), bucket_limits.end());
  bucket_count_ = buckets.size();
  reducer_ = std::make_unique<c10d::Reducer>(
      parameters_, std::move(buckets), native, std::vector<bool>(parameters_.size(), false), options.bucket_bytes,
      options.find_unused_parameters, /*gradient_as_bucket_view=*/false, std::move(names),
      options.first_bucket_bytes, /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      std::vector<int64_t>(bucket_limits.begin(), bucket_limits.end()));
}

DataParallel::~DataParallel() = default;

void DataParallel::backward(const at::Tensor& loss) {
  TORCH_CHECK_VALUE(loss.defined() && loss.requires_grad(),
                    "DataParallel::backward needs a loss that requires grad (computed from the module's parameters)");
  if (!synchronize_) {
    torch::autograd::backward({loss});
    return;
  }
  named(*group_, "backward with gradient all-reduce", [&] {
    // After the first step the reducer knows the order gradients arrive in and rebuilds its
    // buckets to match (every rank agrees, through the group), as DistributedDataParallel does.
    reducer_->rebuild_buckets();
    reducer_->prepare_for_forward();
    reducer_->prepare_for_backward({loss});
    torch::autograd::backward({loss});
  });
}

DataParallel::NoSync::NoSync(DataParallel& parallel) : parallel_(parallel), previous_(parallel.synchronize_) {
  parallel_.synchronize_ = false;
}

DataParallel::NoSync::~NoSync() { parallel_.synchronize_ = previous_; }

}  // namespace torchbridge::distributed

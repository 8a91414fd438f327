#include <torchbridge/distributed/data_parallel.h>

#include "distributed/host_staging.h"
#include "distributed/parameter_agreement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

// Tells c10d's reducer its buckets are final. Its rebuild after the first step (to the order
// gradients arrive in) broadcasts that order as a tensor on the parameters' device, which Gloo
// cannot take for an SDK device, so host staging skips it; but until a rebuild the reducer's
// hooks record every parameter of every step for it (about 16 bytes per parameter per step,
// without bound). The flag is protected; a member pointer taken in a derived class reads it
// legally without making the reducer one.
struct FinalBuckets : c10d::Reducer {
  static void mark(c10d::Reducer& reducer) { reducer.*(&FinalBuckets::has_rebuilt_bucket_) = true; }
};

// Runs a step that drives c10d directly; a failure becomes the group's error (naming the lost
// rank when the failure was communication).
template <typename Step>
void named(const ProcessGroup& group, const std::string& what, const Step& step) {
  try {
    step();
  } catch (const std::exception& e) {
    group.raise_failure("DataParallel " + what, e);
  }
}

// In a world of one the average of the gradients is the gradients. c10d's reducer would still
// scale every bucket by 1/world, a pass over all gradients; this hook all-reduces each bucket as it
// is (the collective stays, so the step is the same shape as in a larger world). With gradients
// as bucket views nothing then touches the gradients between backward and the optimizer.
class UnscaledAllReduceHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  using CppCommHookInterface::CppCommHookInterface;

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }
};

// c10d's reducer buckets dense gradients only (it is told none is sparse): a sparse embedding's
// gradient would fail inside backward with "Cannot access storage of SparseTensorImpl".
void refuse_sparse_gradients(torch::nn::Module& module, const std::string& name = "(the model)") {
  const auto* embedding = module.as<torch::nn::Embedding>();
  const auto* bag = module.as<torch::nn::EmbeddingBag>();
  // A frozen one makes no gradient, and the reducer never sees it.
  const bool sparse = (embedding != nullptr && embedding->options.sparse() && embedding->weight.requires_grad()) ||
                      (bag != nullptr && bag->options.sparse() && bag->weight.requires_grad());
  TORCH_CHECK_VALUE(!sparse, "DataParallel: module '", name, "' makes sparse gradients (sparse=true), which ",
                    "DataParallel does not reduce; construct it with sparse=false");
  // Not named_modules(): it hands out the top module as a shared_ptr, which one on the stack is not.
  for (const auto& child : module.named_children()) {
    refuse_sparse_gradients(*child.value(), name == "(the model)" ? child.key() : name + "." + child.key());
  }
}

ModelTensors tensors_of(torch::nn::Module& module, ProcessGroup* group) {
  if (group != nullptr) {
    check_together(*group, "DataParallel", [&] { refuse_sparse_gradients(module); });
  }
  ModelTensors tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) tensors.parameters.emplace_back(item.key(), item.value());
  tensors.buffers = module.buffers(/*recurse=*/true);
  return tensors;
}

}  // namespace

DataParallel::DataParallel(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group,
                           DataParallelOptions options)
    // `group` copied, not moved: tensors_of reads it, and arguments are evaluated in no set order.
    : DataParallel(tensors_of(module, group.get()), group, options) {}

DataParallel::DataParallel(const ModelTensors& model, std::shared_ptr<ProcessGroup> group,
                           DataParallelOptions options)
    : group_(std::move(group)) {
  TORCH_CHECK_VALUE(group_ != nullptr, "DataParallel needs a process group (torchbridge::distributed::init())");
  std::unordered_map<size_t, std::string> names;
  // Every parameter, frozen ones too: each rank starts from rank 0's, as DistributedDataParallel
  // broadcasts them all. Only the trained ones go into the reducer.
  std::vector<std::pair<std::string, at::Tensor>> every;
  // What this rank refuses alone (its model, its device) every rank refuses: the others were left
  // in the parameter agreement's collectives, to fail on a lost peer or the timeout without the reason.
  check_together(*group_, "DataParallel", [&] {
    TORCH_CHECK_VALUE(options.bucket_bytes > 0 && options.first_bucket_bytes > 0,
                      "DataParallel bucket sizes must be positive, got bucket_bytes ", options.bucket_bytes,
                      " and first_bucket_bytes ", options.first_bucket_bytes);
    std::vector<std::pair<std::string, at::Tensor>> trained;
    for (const auto& [name, parameter] : model.parameters) {
      every.emplace_back(name, parameter);
      if (!parameter.requires_grad()) continue;
      names.emplace(parameters_.size(), name);
      parameters_.push_back(parameter);
      trained.emplace_back(name, parameter);
    }
    TORCH_CHECK_VALUE(!parameters_.empty(), "DataParallel: the module has no parameter that requires a gradient");
    const c10::Device device = parameters_.front().device();
    for (const auto& [name, parameter] : trained) {
      TORCH_CHECK_VALUE(parameter.device() == device, "DataParallel trains a model on one device: parameter '", name,
                        "' is on ", parameter.device(), ", '", trained.front().first, "' on ", device);
    }
    // Gloo reduces CPU tensors, NCCL CUDA tensors; an SDK device's gradients travel through host memory.
    check_collective_device(*group_, device, "DataParallel");
    host_staging_ = device.is_privateuseone();
    TORCH_CHECK_VALUE(!(host_staging_ && options.find_unused_parameters), "DataParallel: find_unused_parameters is ",
                      "not supported on ", device, " (c10d's reducer exchanges its unused-parameter map as a ",
                      "device tensor, which Gloo cannot take)");
  });
  const auto& native = group_->native();

  check_same_parameters_on_every_rank(*group_, every, "DataParallel");
  std::vector<at::Tensor> state;
  for (const auto& named : every) state.push_back(named.second);
  for (const auto& b : model.buffers) state.push_back(b);
  broadcast_through_host(*group_, state, 0);
  if (options.broadcast_buffers) buffers_ = model.buffers;

  // Buckets in reverse registration order (the order backward produces gradients in), as
  // DistributedDataParallel assigns them: a small first bucket, then bucket_bytes each.
  const std::vector<size_t> limits = {static_cast<size_t>(options.first_bucket_bytes),
                                      static_cast<size_t>(options.bucket_bytes)};
  auto [buckets, bucket_limits] = c10d::compute_bucket_assignment_by_size(parameters_, limits);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(bucket_limits.begin(), bucket_limits.end());
  bucket_count_ = buckets.size();
  reducer_ = std::make_shared<c10d::Reducer>(
      parameters_, std::move(buckets), native, std::vector<bool>(parameters_.size(), false), options.bucket_bytes,
      options.find_unused_parameters, options.gradient_as_bucket_view, std::move(names),
      options.first_bucket_bytes, /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      std::vector<int64_t>(bucket_limits.begin(), bucket_limits.end()));
  logger_ = std::make_shared<c10d::Logger>(reducer_);
  reducer_->set_logger(logger_);
  if (host_staging_) {
    FinalBuckets::mark(*reducer_);
    reducer_->register_comm_hook(make_host_staging_hook(group_));
  } else if (group_->world_size() == 1) {
    reducer_->register_comm_hook(std::make_unique<UnscaledAllReduceHook>(native));
  }
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
    // Not through host staging: the reducer broadcasts the new order as a tensor on the
    // parameters' device, which Gloo cannot take; the buckets keep reverse registration order
    // (FinalBuckets).
    if (!host_staging_) reducer_->rebuild_buckets();
    reducer_->prepare_for_forward();
    reducer_->prepare_for_backward({loss});
    torch::autograd::backward({loss});
  });
  // After the backward pass, not before: a buffer the graph saved (batch norm's running variance
  // in eval mode) must not change under it. broadcast_through_host names its own failures.
  if (!buffers_.empty()) broadcast_through_host(*group_, buffers_, 0);
}

DataParallel::NoSync::NoSync(DataParallel& parallel) : parallel_(parallel), previous_(parallel.synchronize_) {
  parallel_.synchronize_ = false;
}

DataParallel::NoSync::~NoSync() { parallel_.synchronize_ = previous_; }

}  // namespace torchbridge::distributed

#include "distributed/host_staging.h"


#include <torchbridge/distributed/process_group.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

// DistributedDataParallel's broadcast buffer for the initial state.
constexpr size_t kBroadcastBytes = 250u << 20;

class HostStagingHook : public c10d::CommHookInterface {
 public:
  explicit HostStagingHook(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor device_buffer = bucket.getBuffer();
    at::Tensor host = device_buffer.to(at::kCPU);
    std::vector<at::Tensor> tensors{host};
    const double world = group_->world_size();
    return group_->native()->allreduce(tensors)->getFuture()->then(
        [host, device_buffer, world](c10::ivalue::Future& done) {
          // then() runs this when the all-reduce failed too (a rank was lost): value() rethrows its
          // error, which fails the bucket's future. Unchecked, the unreduced host copy divided by
          // the world size became the gradient, and the survivors trained on and exited 0.
          (void)done.value();
          host.div_(world);
          device_buffer.copy_(host);
          return c10::IValue(device_buffer);
        },
        c10::TensorType::get());
  }

  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

std::unique_ptr<c10d::CommHookInterface> make_host_staging_hook(std::shared_ptr<ProcessGroup> group) {
  return std::make_unique<HostStagingHook>(std::move(group));
}

void check_collective_device(const ProcessGroup& group, const c10::Device& device, const char* who) {
  if (device.is_cpu() || device.is_privateuseone()) return;
  TORCH_CHECK_VALUE(!device.is_cuda() || group.backend() == CollectiveBackend::nccl, who, ": parameters on ", device,
                    " need a process group with NCCL (init with device \"cuda\"); this one has ",
                    to_string(group.backend()));
  TORCH_CHECK_VALUE(device.is_cuda(), who, " has no collective for ", device, " parameters: CPU tensors go through ",
                    "Gloo, SDK devices' through host memory, CUDA's through NCCL");
}

void broadcast_through_host(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root) {
  const at::NoGradGuard no_grad;
  // CPU tensors take part as they are, and so do CUDA tensors when the group has NCCL and all of
  // them are on CUDA (NCCL broadcasts them where they are); the rest through host copies.
  const bool on_nccl = group.backend() == CollectiveBackend::nccl && !tensors.empty() &&
                       std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_cuda(); });
  const auto staged = [on_nccl](const at::Tensor& t) { return !t.is_cpu() && !on_nccl; };
  std::vector<at::Tensor> sent;
  for (const auto& tensor : tensors) sent.push_back(staged(tensor) ? tensor.detach().to(at::kCPU) : tensor.detach());
  try {
    c10d::broadcast_coalesced(group.native(), sent, kBroadcastBytes, root);
  } catch (const std::exception& e) {
    group.raise_failure("broadcasting rank " + std::to_string(root) + "'s tensors", e);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (staged(tensors[i])) tensors[i].detach().copy_(sent[i]);
  }
}

}  // namespace torchbridge::distributed

#include "distributed/host_staging.h"


#include <torchbridge/distributed/process_group.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

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
        [host, device_buffer, world](c10::ivalue::Future& /*done*/) {
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

void broadcast_through_host(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root) {
  const at::NoGradGuard no_grad;
  std::vector<at::Tensor> host;  // CPU tensors take part as they are
  for (const auto& tensor : tensors) host.push_back(tensor.is_cpu() ? tensor.detach() : tensor.detach().to(at::kCPU));
  try {
    c10d::broadcast_coalesced(group.native(), host, kBroadcastBytes, root);
  } catch (const std::exception& e) {
    group.raise_failure("broadcasting rank " + std::to_string(root) + "'s tensors", e);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].is_cpu()) tensors[i].detach().copy_(host[i]);
  }
}

}  // namespace torchbridge::distributed

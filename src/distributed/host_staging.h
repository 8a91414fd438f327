#pragma once
// Collectives for parameters on an SDK device (PrivateUse1): Gloo takes CPU tensors only and an
// SDK runtime offers no collective of its own yet, so the tensors travel through host memory:
// copied to the CPU, reduced or broadcast there, copied back. Internal to the distributed layer.

#include <memory>
#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
struct Device;
}
namespace c10d {
class CommHookInterface;
}

namespace torchbridge::distributed {

class ProcessGroup;

// A communication hook for c10d::Reducer: each gradient bucket is copied to the host, all-reduced
// there (asynchronously, so later buckets' backward overlaps it), divided by the world size, as
// the reducer's own all-reduce would, and copied back into the bucket.
std::unique_ptr<c10d::CommHookInterface> make_host_staging_hook(std::shared_ptr<ProcessGroup> group);

// Refuses, naming `who` and the way out, parameters on `device` that `group` has no collective
// for: CPU tensors go through Gloo, an SDK device's through host memory, CUDA tensors need a
// group with NCCL (InitOptions::device "cuda").
void check_collective_device(const ProcessGroup& group, const c10::Device& device, const char* who);

// Rank `root`'s values of `tensors` into every rank's: CPU tensors directly, CUDA tensors directly
// when the group has NCCL, others through host copies. Failures raise the group's error naming
// the lost rank.
void broadcast_through_host(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root);

}  // namespace torchbridge::distributed

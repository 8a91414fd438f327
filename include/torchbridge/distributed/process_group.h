#pragma once
// A process group for distributed training, made of PyTorch's own c10d parts: a TCPStore at
// MASTER_ADDR:MASTER_PORT for the rendezvous (an in-process store for a world of one) and the
// collective backend the device needs (Gloo for CPU and SDK devices; NCCL for CUDA tensors, with
// Gloo beside it for CPU tensors). Launched by torchrun, or alone as a world of one. Every wait is bounded by the timeout,
// and a failure (a rank that died, one that never came) raises a c10::Error naming this rank,
// the operation and the cause, never a hang.

#include <torchbridge/distributed/launch_environment.h>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace torchbridge {
class Backend;
}

namespace torchbridge::distributed {

enum class CollectiveBackend { gloo, nccl };
std::string to_string(CollectiveBackend backend);
// "gloo" or "nccl"; anything else is a c10::ValueError naming the value.
CollectiveBackend parse_collective_backend(const std::string& name);

// Why the nccl collective backend cannot be used in this build and process, or "" when it can:
// a torch built without NCCL, NCCL's headers missing when TorchBridge was built, or no CUDA device.
std::string nccl_unavailable_reason();

struct InitOptions {
  // The device training runs on (a backend name: "cpu", "cuda", "emu", ...); it picks the
  // default collective backend: NCCL for cuda, Gloo for everything else. With NCCL, "cuda" means
  // the GPU of this rank's LOCAL_RANK (torchrun's one GPU per local rank); "cuda:N" names one.
  std::string device = "cpu";
  std::optional<CollectiveBackend> backend;  // overrides the default
  // How long the rendezvous and each collective may wait for the other ranks.
  std::chrono::milliseconds timeout{60'000};
};

class Liveness;

class ProcessGroup {
 public:
  // `store` is the rendezvous store `native` met through; in a launched world of more than one,
  // each rank beats a heartbeat in it, so a failure can name the rank that was lost.
  ProcessGroup(LaunchEnvironment environment, CollectiveBackend backend, std::chrono::milliseconds timeout,
               c10::intrusive_ptr<c10d::ProcessGroup> native, const c10::intrusive_ptr<c10d::Store>& store);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return environment_.rank; }
  int world_size() const { return environment_.world_size; }
  const LaunchEnvironment& environment() const { return environment_; }
  CollectiveBackend backend() const { return backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The c10d process group, for what this class does not wrap.
  const c10::intrusive_ptr<c10d::ProcessGroup>& native() const { return native_; }

  // Collectives on CPU tensors (always through Gloo), in place, waited for.
  void all_reduce_sum(at::Tensor& tensor);
  void broadcast(at::Tensor& tensor, int root);
  // Every rank's `tensor`, in rank order (each rank must pass the same shape and dtype).
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  void barrier();
  // For what one rank checks alone before the ranks' next collective (its model, its device):
  // every rank calls it, passing its refusal ("" when it has none). When any rank refused, every
  // rank raises a c10::ValueError, the refusing rank its own refusal and the others one naming
  // that rank and quoting it, rather than waiting for it in the next collective until the timeout.
  void refuse_together(const std::string& who, const std::string& refusal);

  // Raises the c10::Error every failed collective raises: "rank r of w: <operation> failed:
  // <which rank was lost, or that all are alive>. What this rank saw: <cause>" (a world of one:
  // just the cause). For code that drives `native()` itself, as DataParallel does.
  [[noreturn]] void raise_failure(const std::string& operation, const std::string& cause) const;
  // The same for a caught exception: a failure of this rank's own work (a c10::Error that is not
  // one of c10d's DistErrors) keeps its message and asks nothing of the other ranks.
  [[noreturn]] void raise_failure(const std::string& operation, const std::exception& failure) const;

 private:
  LaunchEnvironment environment_;
  CollectiveBackend backend_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroup> native_;
  std::unique_ptr<Liveness> liveness_;  // null for a world of one
};

// The device of `backend` this rank works on: for CUDA the GPU of its LOCAL_RANK (torchrun's one GPU
// per local rank, the one an NCCL group is bound to); for every other backend device 0 (SDK devices
// stage through host memory, so ranks may share it). Raises naming the index when the backend has
// no such device.
c10::Device rank_device(const ProcessGroup& group, const Backend& backend);

// Joins the group the launch environment describes (read_launch_environment()).
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});
std::shared_ptr<ProcessGroup> init(const LaunchEnvironment& environment, const InitOptions& options);

}  // namespace torchbridge::distributed

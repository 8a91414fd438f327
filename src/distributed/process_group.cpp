#include <torchbridge/distributed/process_group.h>

#include "distributed/failure_cause.h"
#include "distributed/collective_backends.h"
#include "distributed/liveness.h"

#include <torchbridge/backend.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

std::string where(const LaunchEnvironment& env) {
  return "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
}

// Runs a step of joining the group, which has no liveness to consult yet.
template <typename Step>
auto joining(const LaunchEnvironment& env, const std::string& what, const Step& step) {
  try {
    return step();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, where(env), ": ", what, " failed: ", failure_cause(e));
  }
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

// Runs one collective of `group`; a failure becomes the group's error, naming the lost rank.
template <typename Step>
void run(const ProcessGroup& group, const std::string& operation, const Step& step) {
  try {
    step();
  } catch (const std::exception& e) {
    group.raise_failure(operation, e);
  }
}

c10::intrusive_ptr<c10d::Store> new_rendezvous_store(const LaunchEnvironment& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  return joining(env,
               "meeting the other ranks at MASTER_ADDR " + env.master_addr + ", MASTER_PORT " +
                   std::to_string(env.master_port) + " (timeout " + std::to_string(timeout.count()) + " ms)",
               [&] { return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options); });
}

// One rendezvous store per process and address while any group uses it: a second group (init
// called again, with the first alive) meets through the same store under its own prefix. Rank 0
// serving a second store on MASTER_PORT failed with EADDRINUSE, and its clients could meet the
// first group's store instead.
c10::intrusive_ptr<c10d::Store> rendezvous_store(const LaunchEnvironment& env, std::chrono::milliseconds timeout) {
  if (!env.launched) return c10::make_intrusive<c10d::HashStore>();  // a world of one meets nobody
  static std::mutex mutex;
  static std::map<std::string, c10::weak_intrusive_ptr<c10d::Store>> stores;
  const std::lock_guard<std::mutex> lock(mutex);
  const std::string address = env.master_addr + ":" + std::to_string(env.master_port);
  if (const auto found = stores.find(address); found != stores.end()) {
    if (auto alive = found->second.lock()) return alive;
  }
  auto store = new_rendezvous_store(env, timeout);
  stores.insert_or_assign(address, c10::weak_intrusive_ptr<c10d::Store>(store));
  return store;
}

// Each group's keys under their own prefix: a job's attempt (torchelastic restarts share the
// agent's store with earlier attempts) and the group's number in this process (a second init read
// the first group's Gloo addresses and liveness keys). Every rank creates its groups in one order,
// as torch's own groups require, so the numbers agree.
std::string group_prefix(const LaunchEnvironment& env) {
  static std::atomic<int> groups_created{0};
  return "torchbridge/attempt_" + std::to_string(env.restart_count.value_or(0)) + "/group_" +
         std::to_string(groups_created++);
}

void check_tensor(const at::Tensor& tensor, const char* operation) {
  TORCH_CHECK_VALUE(tensor.defined() && tensor.is_cpu(), operation,
                    " takes a defined CPU tensor (copy device tensors to the CPU first), got ",
                    tensor.defined() ? tensor.device().str() : std::string("an undefined tensor"));
}

}  // namespace

std::string to_string(CollectiveBackend backend) { return backend == CollectiveBackend::gloo ? "gloo" : "nccl"; }

CollectiveBackend parse_collective_backend(const std::string& name) {
  if (name == "gloo") return CollectiveBackend::gloo;
  if (name == "nccl") return CollectiveBackend::nccl;
  TORCH_CHECK_VALUE(false, "collective backend '", name, "' is not one of: gloo, nccl");
}

ProcessGroup::ProcessGroup(LaunchEnvironment environment, CollectiveBackend backend,
                           std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::ProcessGroup> native,
                           const c10::intrusive_ptr<c10d::Store>& store)
    : environment_(std::move(environment)), backend_(backend), timeout_(timeout), native_(std::move(native)) {
  if (environment_.launched && environment_.world_size > 1) {
    liveness_ = std::make_unique<Liveness>(store, environment_, heartbeat_period(timeout_));
  }
}

ProcessGroup::~ProcessGroup() {
  // The last owner ends c10d's group as torch's destroy_process_group() does. Left to its own
  // destructor, ProcessGroupNCCL shuts itself down the same way but first warns that
  // "destroy_process_group() was not called", a Python function, at the end of every C++ program
  // (the H200's distributed_benchmark). A group something else still holds is left to it.
  if (!native_ || native_.use_count() != 1) return;
  try {
    native_->shutdown();
  } catch (const std::exception& error) {  // a destructor must not throw; the group is lost either way
    TORCH_WARN("rank ", environment_.rank, ": shutting the process group down failed: ", error.what());
  }
}

void ProcessGroup::raise_failure(const std::string& operation, const std::string& cause) const {
  // Which rank was lost comes first: it is what the reader needs, and the cause, what Gloo saw
  // from here, often names only an address.
  if (liveness_) {
    TORCH_CHECK(false, where(environment_), ": ", operation, " failed: ", liveness_->diagnose(),
                ". What this rank saw: ", cause);
  }
  TORCH_CHECK(false, where(environment_), ": ", operation, " failed: ", cause);
}

void ProcessGroup::raise_failure(const std::string& operation, const std::exception& failure) const {
  if (is_communication_failure(failure)) raise_failure(operation, failure_cause(failure));
  TORCH_CHECK(false, where(environment_), ": ", operation, " failed: ", failure_cause(failure));
}

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) {
  check_tensor(tensor, "all_reduce_sum");
  std::vector<at::Tensor> tensors{tensor};
  run(*this, "all_reduce", [&] { wait(native_->allreduce(tensors)); });
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  TORCH_CHECK_VALUE(root >= 0 && root < world_size(), "broadcast root ", root, " is not a rank of this world (0..",
                    world_size() - 1, ")");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run(*this, "broadcast from rank " + std::to_string(root),
        [&] { wait(native_->broadcast(tensors, options)); });
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  check_tensor(tensor, "all_gather");
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size(); ++r) outputs[0].push_back(at::empty_like(tensor));
  std::vector<at::Tensor> inputs{tensor.contiguous()};
  run(*this, "all_gather", [&] { wait(native_->allgather(outputs, inputs)); });
  return outputs[0];
}

void ProcessGroup::barrier() {
  run(*this, "barrier", [&] { wait(native_->barrier()); });
}

void ProcessGroup::refuse_together(const std::string& who, const std::string& refusal) {
  if (world_size() == 1) {
    TORCH_CHECK_VALUE(refusal.empty(), refusal);
    return;
  }
  const auto lengths = all_gather(at::full({1}, static_cast<int64_t>(refusal.size()), at::kLong));
  std::vector<int64_t> refusing;
  int64_t longest = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    const int64_t length = lengths[r].item<int64_t>();
    if (length > 0) refusing.push_back(static_cast<int64_t>(r));
    longest = std::max(longest, length);
  }
  if (refusing.empty()) return;
  // Every rank takes part in the second gather, the refusing ones too: the others need the text.
  at::Tensor text = at::zeros({longest}, at::kByte);
  std::copy(refusal.begin(), refusal.end(), text.data_ptr<uint8_t>());
  const auto texts = all_gather(text);
  TORCH_CHECK_VALUE(refusal.empty(), refusal);
  const auto first = static_cast<size_t>(refusing.front());
  const std::string quoted(reinterpret_cast<const char*>(texts[first].const_data_ptr<uint8_t>()),
                           static_cast<size_t>(lengths[first].item<int64_t>()));
  const std::string refusers =
      refusing.size() == 1 ? "rank " + std::to_string(first) : "ranks " + c10::str(c10::IntArrayRef(refusing));
  TORCH_CHECK_VALUE(false, who, ", rank ", rank(), " of ", world_size(), ": ", refusers,
                    " refused, so this rank stops too. Rank ", first, " said: ", quoted);
}

c10::Device rank_device(const ProcessGroup& group, const Backend& backend) {
  return backend.device(backend.device_type() == c10::DeviceType::CUDA ? group.environment().local_rank : 0);
}

std::shared_ptr<ProcessGroup> init(const InitOptions& options) { return init(read_launch_environment(), options); }

std::shared_ptr<ProcessGroup> init(const LaunchEnvironment& env, const InitOptions& options) {
  TORCH_CHECK_VALUE(options.timeout.count() > 0, "the distributed timeout must be positive, got ",
                    options.timeout.count(), " ms");
  // The device names a backend ("cpu", "emu", "cuda", "cuda:1"); anything else (a typo, "nccl")
  // is refused rather than given Gloo as if it had named the CPU.
  const size_t colon = options.device.find(':');
  const std::string device_name = options.device.substr(0, colon);
  c10::DeviceType device_type = c10::DeviceType::CPU;
  try {
    device_type = BackendRegistry::instance().device_type_of(device_name);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "the distributed device '", options.device, "' does not name a backend: ", e.msg());
  }
  // -1: no index given (NCCL then takes the GPU of this rank's LOCAL_RANK).
  const int64_t device_index =
      colon == std::string::npos
          ? -1
          : parse_integer(std::string_view(options.device).substr(colon + 1), "the distributed device's index", 0,
                          INT8_MAX);
  // CUDA's own tensors (ROCm's too); an SDK device such as cudasdk is PrivateUse1 and uses Gloo.
  const bool cuda = device_type == c10::DeviceType::CUDA;
  const CollectiveBackend backend =
      options.backend.value_or(cuda ? CollectiveBackend::nccl : CollectiveBackend::gloo);
  const std::string nccl_unavailable = backend == CollectiveBackend::nccl ? nccl_unavailable_reason() : "";
  TORCH_CHECK_VALUE(nccl_unavailable.empty(), "the nccl collective backend is not available: ", nccl_unavailable,
                    "; Gloo reduces host tensors instead: train on device 'cpu' (Python and the CLI), or set "
                    "InitOptions::backend to gloo (C++)");
  TORCH_CHECK_VALUE(backend == CollectiveBackend::gloo || cuda, "the nccl collective backend reduces CUDA tensors, ",
                    "not device '", options.device, "'; use gloo");
  const auto store = c10::make_intrusive<c10d::PrefixStore>(group_prefix(env), rendezvous_store(env, options.timeout));
  // Gloo always: the CPU tensors of the option and parameter checks, fingerprints and host staging.
  const auto gloo = joining(env, "connecting Gloo to every other rank (timeout " +
                                   std::to_string(options.timeout.count()) + " ms)",
                          [&] { return make_gloo_backend(store, env.rank, env.world_size, options.timeout); });
  auto native = c10::make_intrusive<c10d::ProcessGroup>(store, env.rank, env.world_size);
  native->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  if (backend == CollectiveBackend::nccl) {
    // CUDA tensors go to NCCL: c10d picks the backend by the tensors' device type.
    const c10::Device gpu(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index >= 0 ? device_index : env.local_rank));
    const auto nccl = make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("nccl", store), env.rank,
                                        env.world_size, options.timeout, gpu);
    native->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    // After setBackend, which hands every backend the group's bound device (none: Gloo has none).
    nccl->setBoundDeviceId(gpu);
  }
  native->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return std::make_shared<ProcessGroup>(env, backend, options.timeout, std::move(native), store);
}

}  // namespace torchbridge::distributed

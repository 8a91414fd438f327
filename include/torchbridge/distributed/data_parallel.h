#pragma once
// Data parallel training for LibTorch modules, what DistributedDataParallel is in Python
// (LibTorch has none, pytorch#48959), built on c10d's own Reducer: every rank holds the whole
// model and a share of the batch; gradients are averaged across ranks in buckets (25 MiB, the
// last-registered parameters first) whose all-reduce starts from autograd hooks as each bucket
// fills, so communication overlaps the rest of backward.
//
//   auto group = torchbridge::distributed::init();
//   torchbridge::distributed::DataParallel parallel(*model, group);  // rank 0's weights everywhere
//   loss = ...forward on this rank's share...;
//   parallel.backward(loss);   // gradients now averaged over every rank
//   optimizer.step();
//
// Accumulating over micro-batches: backward passes inside `auto scope = parallel.no_sync();`
// keep their gradients local; the next parallel.backward() outside reduces the sum.

#include <torchbridge/distributed/process_group.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}
namespace c10d {
class Logger;
class Reducer;
}
namespace torch::nn {
class Module;
}

namespace torchbridge::distributed {

struct DataParallelOptions {
  int64_t bucket_bytes = 25LL << 20;       // as DistributedDataParallel's bucket_cap_mb=25
  int64_t first_bucket_bytes = 1LL << 20;  // a small first bucket starts communication early
  // Parameters a step may leave without a gradient are found by walking the graph from the loss
  // (costs a traversal per step); without it such a parameter makes backward wait forever on the
  // CPU and raise on the next step.
  bool find_unused_parameters = false;
  // Gradients become views into the all-reduce buckets (DistributedDataParallel's
  // gradient_as_bucket_view): nothing is copied from the buckets back into the gradients after
  // the all-reduce, and nothing into them while gradients are kept between steps (zeroed in place
  // rather than reset). A gradient then shares its bucket's storage: do not detach_() it or
  // replace its storage. Saves one pass over every gradient per step (two, in a world of one).
  bool gradient_as_bucket_view = false;
  // After each backward that all-reduces, rank 0's buffers (BatchNorm's running statistics) are
  // broadcast to every rank, so ranks that saw different batches go on with the same ones.
  // DistributedDataParallel's broadcast_buffers=True does it before each forward; with nothing
  // changing buffers in between, the next forward sees the same values either way, and the state
  // a rank saves after a step is the same on every rank.
  bool broadcast_buffers = true;
};

// What DataParallel needs of a model, for models that are not torch::nn modules (TorchScript):
// its parameters by name, in registration order, and its buffers.
struct ModelTensors {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::vector<at::Tensor> buffers;
};

class DataParallel {
 public:
  // Checks that every rank has the same parameter shapes (a mismatch is an error naming the
  // ranks and the parameter), then broadcasts rank 0's parameters and buffers to all (the
  // buffers again after each step, DataParallelOptions::broadcast_buffers). Parameters
  // on the CPU, or on an SDK device, whose gradients are all-reduced through host memory.
  DataParallel(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group, DataParallelOptions options = {});
  DataParallel(const ModelTensors& model, std::shared_ptr<ProcessGroup> group, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // loss.backward(), leaving every parameter's gradient averaged over all ranks and, with
  // broadcast_buffers, every rank's buffers rank 0's (inside no_sync(): plain loss.backward()).
  void backward(const at::Tensor& loss);

  class NoSync {
   public:
    explicit NoSync(DataParallel& parallel);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& parallel_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  // What no_sync() sets and restores, for front ends that cannot hold its scope (Python's).
  void set_synchronize(bool synchronize) { synchronize_ = synchronize; }
  bool synchronize() const { return synchronize_; }

  const ProcessGroup& group() const { return *group_; }
  size_t bucket_count() const { return bucket_count_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> buffers_;  // broadcast from rank 0 after each synchronized backward; empty without broadcast_buffers
  std::shared_ptr<c10d::Reducer> reducer_;
  // The reducer reports to a logger: with find_unused_parameters, a step whose unused set differs
  // from the last one's says so through it (c10d dereferences it unchecked there).
  std::shared_ptr<c10d::Logger> logger_;
  size_t bucket_count_ = 0;
  bool synchronize_ = true;
  bool host_staging_ = false;  // an SDK device's gradients are all-reduced through host memory
};

}  // namespace torchbridge::distributed

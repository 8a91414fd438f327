#pragma once
// ZeRO stage 1 for LibTorch, what torch.distributed.optim.ZeroRedundancyOptimizer is in Python:
// the optimizer's state is sharded across ranks. Each parameter belongs to one rank (largest
// first, to the rank holding the fewest bytes so far, so shards balance); each rank keeps an
// optimizer over its own parameters only and steps them with the gradients DataParallel averaged,
// then every rank broadcasts the parameters it stepped. The state each rank holds is about
// 1/world of plain data parallel's; the parameters are plain data parallel's, bit for bit, for
// optimizers that update each parameter on its own (SGD, Adam, AdamW: every torch::optim one).
//
//   DataParallel parallel(*model, group);
//   ZeroRedundancyOptimizer optimizer(model->parameters(), group, [](std::vector<at::Tensor> shard) {
//     return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
//   });
//   optimizer.zero_grad(); parallel.backward(loss); optimizer.step();

#include <torchbridge/distributed/process_group.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}

namespace torchbridge::distributed {

class ZeroRedundancyOptimizer {
 public:
  // Builds this rank's optimizer over its shard (not called for a rank whose shard is empty).
  using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

  // `parameters` in the same order on every rank (the model's parameters()).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          const OptimizerFactory& make_optimizer);
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Clears every parameter's gradient (each rank computes all of them).
  void zero_grad();
  // Steps this rank's shard, then exchanges the stepped parameters so every rank holds all.
  void step();

  // The rank whose optimizer steps parameters[index].
  int owner(size_t index) const { return owners_.at(index); }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  // Null when this rank owns no parameter (a world larger than the parameter count).
  torch::optim::Optimizer* local_optimizer() const { return local_.get(); }
  // Bytes of optimizer state held on this rank (SGD's momentum, Adam's and AdamW's moments);
  // another optimizer's state is a c10::NotImplementedError naming what is supported.
  int64_t local_state_bytes() const;

  // For a portable checkpoint: the whole optimizer state, gathered from the shards into `full`
  // on rank `root`. `full` is an optimizer of the same kind (Adam or AdamW) over parameters(), in
  // order; other ranks pass nullptr. Collective: every rank calls it.
  void consolidate_state_into(torch::optim::Optimizer* full, int root);
  // For resuming: this rank's shard takes its state from `full` (the whole state, as
  // consolidate_state_into gathered it or a checkpoint restored it).
  void load_state_from(const torch::optim::Optimizer& full);

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::vector<at::Tensor> parameters_;
  std::vector<int> owners_;                          // per parameter
  std::vector<std::vector<at::Tensor>> by_owner_;    // per rank, in parameter order
  std::unique_ptr<torch::optim::Optimizer> local_;
};

// Bytes of the state an optimizer holds for its parameters (see local_state_bytes).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace torchbridge::distributed

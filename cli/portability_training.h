#pragma once
// The training part of the portability run: the built-in transformer learns to imitate a second,
// differently initialised transformer (distillation on random inputs), which needs no dataset.

#include <torch/csrc/jit/api/module.h>

#include <memory>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace torchbridge::cli {

struct TrainingRun {
  torch::jit::Module model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  double first_loss = 0;    // mean of the first 10 steps
  double last_loss = 0;     // mean of the last 10 steps
  double seconds = 0;
  int steps = 0;
};

// With `checkpointing`, each step's forward pass runs as one checkpointed region
// (torchbridge::memory::checkpoint): recomputed during backward instead of kept.
TrainingRun train_transformer(c10::Device device, int steps, uint64_t seed, bool checkpointing = false);
// Adam over a module's parameters, as the run trains with (restoring needs the same type).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const torch::jit::Module& model);
// The same optimizer over some parameters (`torchbridge train --zero1`: one rank's shard).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<at::Tensor> parameters);

}  // namespace torchbridge::cli

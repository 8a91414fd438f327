#pragma once
// `torchbridge train --tensor-parallel K | --pipeline-parallel K`: the built-in mlp (fc1 32->64,
// ReLU, fc2 64->64, ReLU, fc3 64->10) trained split across every rank of the job, then gathered
// back into the whole TorchScript model on every rank, so the run's report (losses, fingerprint)
// means what it means for the other modes.
//   tensor parallel    fc1 column-parallel, fc2 row-parallel (the Megatron pair), fc3 replicated;
//                      every rank sees the whole global batch
//   pipeline parallel  the three layers as consecutive stages, one per rank, over micro-batches

#include <torchbridge/distributed/pipeline_parallel.h>
#include <torchbridge/distributed/process_group.h>

#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace at {
class Tensor;
}

namespace torchbridge::cli {

struct ModelParallelRun {
  double first_loss = 0, last_loss = 0;  // the whole batch's loss, the same on every rank
  int64_t optimizer_state_bytes = 0;     // this rank's Adam state: its slice or stage only
};

// Step k's (inputs, targets) for the whole global batch.
using BatchForStep = std::function<std::pair<at::Tensor, at::Tensor>(int64_t step)>;

// `model` (the built-in mlp, on the CPU or an SDK device) is trained for steps [0, steps) and
// holds the result on every rank afterwards. Raises c10::ValueError when the model is not the mlp's layout or a
// dimension does not split.
ModelParallelRun train_mlp_tensor_parallel(torch::jit::Module& model, const std::shared_ptr<distributed::ProcessGroup>& group,
                                           int64_t steps, const BatchForStep& batch);
ModelParallelRun train_mlp_pipeline_parallel(torch::jit::Module& model,
                                             const std::shared_ptr<distributed::ProcessGroup>& group, int64_t steps,
                                             const BatchForStep& batch, int64_t micro_batches,
                                             distributed::PipelineSchedule schedule);

}  // namespace torchbridge::cli

#pragma once
// Pipeline parallelism: a model split into consecutive stages, stage r on rank r of the group. A
// training step splits the batch into micro-batches; activations flow forward from stage to
// stage and their gradients back, by c10d point-to-point send/recv. Two schedules:
//   gpipe       every micro-batch forward, then every one backward (activations of all
//               micro-batches held at once)
//   one_f_one_b after a warm-up of (stages - stage - 1) forwards, one forward then one backward
//               (at most `stages` micro-batches' activations held per stage)
// Both leave in each stage's parameters the gradient of the mean loss over the whole batch, the
// unsplit model's, up to the order of summation over micro-batches. A stage may be frozen and may
// hand on an integer tensor (token ids to an embedding): no gradient flows back through those,
// as in torch.distributed.pipelining.
//
//   Pipeline pipeline([&](const at::Tensor& x) { return my_stage->forward(x); }, group);
//   double loss = pipeline.train_step(inputs, targets, micro_batches, loss_function);
//   optimizer.step();  // this stage's parameters

#include <torchbridge/distributed/process_group.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace at {
class Tensor;
}

namespace torchbridge::distributed {

enum class PipelineSchedule { gpipe, one_f_one_b };

class Pipeline {
 public:
  using Stage = std::function<at::Tensor(const at::Tensor&)>;
  // (last stage's output for a micro-batch, its targets) -> a scalar loss, mean over its rows
  using LossFunction = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

  // `device`: where this stage computes; what it receives is placed there. Activations and
  // gradients travel between ranks through host memory (Gloo takes CPU tensors).
  Pipeline(Stage stage, std::shared_ptr<ProcessGroup> group, PipelineSchedule schedule = PipelineSchedule::one_f_one_b,
           c10::Device device = c10::Device(c10::kCPU));

  // One step's forward and backward over `micro_batches` equal slices of the batch (dim 0).
  // `inputs` matter on the first stage, `targets` on the last; other ranks may pass undefined
  // tensors. Gradients accumulate into the stage's parameters (zero them before, as usual).
  // Returns the batch's mean loss, on every rank.
  double train_step(const at::Tensor& inputs, const at::Tensor& targets, int64_t micro_batches,
                    const LossFunction& loss);

  int stage_index() const;
  int stage_count() const;
  PipelineSchedule schedule() const { return schedule_; }
  // The most micro-batches whose activations this stage held at once in the last train_step:
  // the schedule's memory cost (GPipe: all of them; 1F1B: at most stages - stage).
  int64_t peak_micro_batches_held() const { return peak_held_; }

 private:
  Stage stage_;
  std::shared_ptr<ProcessGroup> group_;
  PipelineSchedule schedule_;
  c10::Device device_;
  int64_t peak_held_ = 0;
};

}  // namespace torchbridge::distributed

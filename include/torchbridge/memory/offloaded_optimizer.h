#pragma once
// Optimizer-state offload (the ZeRO-Offload recipe) for parameters on an accelerator: the
// optimizer's state (Adam's exp_avg and exp_avg_sq, and whatever else it keeps) and a float32
// master copy of the parameters live in pinned host memory; each step copies the gradients down,
// runs the optimizer on the CPU, and copies the updated parameters back. The device keeps only the
// parameters and their gradients, so it saves exactly the state's size.
//
// The optimizer itself is torch's (any torch::optim optimizer, built by a factory over the host
// copies), so the update is torch's arithmetic run by the CPU's kernels: bit-identical to the same
// optimizer on the device where the device's kernels compute like the CPU's (SDK devices that run
// CPU kernels, e.g. emu), within float rounding elsewhere.
//
// Overlap: parameters are split into buckets (in order, about `bucket_bytes` each), each with its
// own host optimizer. All gradient copies are queued at once on a side stream; the CPU steps bucket
// b as soon as its gradients have arrived, while later buckets are still copying, and queues bucket
// b's parameters back on the same stream. The compute stream is made to wait for the last upload
// with an event: no device synchronize on its critical path.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace torchbridge::memory {

struct OffloadOptions {
  int64_t bucket_bytes = 32ll << 20;  // parameters per bucket (the unit of overlap)
};

class OffloadedOptimizer {
 public:
  // Builds one host optimizer per bucket from the host copies of that bucket's parameters, e.g.
  //   [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::AdamW>(p, options); }
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

  // `parameters`: float32 leaf tensors on one non-CPU device. Raises c10::ValueError naming the
  // parameter when one is on the CPU (nothing to offload), on another device, or not float32.
  OffloadedOptimizer(std::vector<at::Tensor> parameters, Factory factory, OffloadOptions options = {});
  ~OffloadedOptimizer();
  OffloadedOptimizer(const OffloadedOptimizer&) = delete;
  OffloadedOptimizer& operator=(const OffloadedOptimizer&) = delete;

  // One optimizer step over the parameters' current gradients (parameters without a gradient are
  // skipped, as torch's optimizers do). A parameter written since the last step (in place, e.g. by
  // Module::load_state_dict after this optimizer was built, or given new data) is copied into its
  // master first, so the update starts from its current value; one that changed shape, dtype or
  // device raises c10::ValueError before anything is queued. Writes through `p.data()` / Python's
  // `p.data` bypass the parameter's version counter and are not seen: write to the parameter
  // under a NoGradGuard instead.
  void step();
  // The device parameters' gradients: set to undefined (default) or zeroed.
  void zero_grad(bool set_to_none = true);

  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  // The host optimizers, one per bucket, e.g. to change their learning rate or save their state.
  std::vector<torch::optim::Optimizer*> host_optimizers() const;
  size_t bucket_count() const { return buckets_.size(); }
  // Parameter `index`'s float32 master copy in host memory and the host optimizer that updates it:
  // the optimizer's state is keyed by the master, e.g. to save or load it. c10::IndexError past the end.
  std::pair<at::Tensor, torch::optim::Optimizer*> host_side_of(size_t index) const;

 private:
  struct Bucket;
  std::vector<at::Tensor> parameters_;
  c10::Device device_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
};

}  // namespace torchbridge::memory

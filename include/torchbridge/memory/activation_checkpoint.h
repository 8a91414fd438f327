#pragma once
// Activation checkpointing for C++ programs: a region's intermediate activations are dropped after
// its forward pass and recomputed during backward, trading compute for memory. LibTorch has no
// equivalent of torch.utils.checkpoint (pytorch#52744); this is one with the semantics of
// `use_reentrant=False`:
//   - parameters used inside the region receive gradients even when no input requires grad;
//   - works with backward() and with torch::autograd::grad (gradients go to whatever asked for them);
//   - regions nest; outputs may be several tensors;
//   - the recomputation runs under the autocast state the forward pass ran under, and with the
//     CPU's and the inputs' devices' random generators reset to their state at the forward pass,
//     so dropout draws the same mask (preserve_rng_state).
// Gradients are bit-identical to running the region without checkpointing.
//
// How, and why not like torch: torch's non-reentrant checkpoint recomputes inside saved-tensor
// hooks, but in LibTorch 2.13 the default saved-tensor hooks exist only as Python objects
// (at::SavedTensorDefaultHooks stores c10::SafePyObject). Here the region's forward pass runs once
// with autograd recording; the graph it built is read to find where the region's backward leaves
// it (the edges to its inputs, to parameters and to captured tensors), then dropped with the
// activations it saved. One backward node replaces the region: it recomputes the region and runs
// its backward as a nested autograd call ending at those edges. Peak memory inside one region is
// that region's activations, as with torch's checkpoint during backward.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace torchbridge::memory {

struct CheckpointOptions {
  // Reset the random generators of the CPU and of the inputs' devices to their forward-pass state
  // while recomputing, so random operators (dropout) reproduce their values. Costs a state copy per
  // region; turn off only for regions without randomness.
  bool preserve_rng_state = true;
  // Check that the recomputation produced outputs of the same number, shapes, dtypes and devices as
  // the forward pass (torch's determinism_check="default"); a mismatch raises instead of producing
  // wrong gradients.
  bool check_recomputed_metadata = true;
};

using RegionFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs) as a checkpointed region and returns its outputs. Outputs that require grad are
// new tensors (sharing the values) whose backward recomputes the region. Without grad mode (or in
// inference mode) fn simply runs: there is nothing to save for backward.
//
// fn must compute the same thing when called again (the region runs twice), must not modify its
// inputs in place, and the inputs must not be modified in place before backward; each of these
// raises c10::Error naming the input or output concerned.
std::vector<at::Tensor> checkpoint(const RegionFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

// The single-tensor form: y = checkpoint([&](const at::Tensor& x) { return block(x); }, x).
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

// The building block behind checkpoint(), for callers that run the region's forward themselves
// (the Python binding runs a Python function). Construct it right before the forward pass: it
// records the random generators' and autocast's state, the inputs' versions and where the
// region's autograd nodes start. After the forward pass, finish() replaces the region's graph.
class CheckpointRegion {
 public:
  using Recompute = std::function<std::vector<at::Tensor>()>;

  explicit CheckpointRegion(const std::vector<at::Tensor>& inputs, const CheckpointOptions& options = {});
  ~CheckpointRegion();
  CheckpointRegion(const CheckpointRegion&) = delete;
  CheckpointRegion& operator=(const CheckpointRegion&) = delete;

  // `outputs`: what the forward pass returned. `attach_to[i]`: the tensor that will carry the
  // region's backward for outputs[i] (a detached alias of it, e.g. outputs[i].detach()), or an
  // undefined tensor where outputs[i] does not require grad. `recompute` runs the region again
  // during backward and returns the same outputs. Call once.
  void finish(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& attach_to, Recompute recompute);

  struct State;  // what the region recorded; defined in the .cpp, handed to the backward node

 private:
  std::unique_ptr<State> state_;
};

}  // namespace torchbridge::memory

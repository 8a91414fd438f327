#pragma once
// Layers whose forward pass updates state (FP8's delayed scaling: every call records an amax and
// moves the scale) must not update it again when activation checkpointing recomputes them, and
// must recompute with the values their forward pass used; otherwise the backward pass
// differentiates other numbers than the forward computed, and the state counts each step twice.
//
// A checkpointed region (torchbridge::memory::CheckpointRegion, also behind Python's
// torchbridge.memory.checkpoint) keeps a RecomputationRecord. While its forward pass runs, a
// stateful layer records the value it used under a key of its own (the address of its state);
// while the region is recomputed, the layer replays those values in the same order instead of
// updating its state. Regions nest: a layer in an inner region records into every region whose
// forward pass is running, and a region recomputed inside an outer one's recomputation is
// recorded with the outer record's values. torch.utils.checkpoint keeps no such record; its
// recomputation updates the state again unless it is given this record's scopes as its context_fn
// (torchbridge.fp8.checkpoint_contexts; docs/fp8.md).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <unordered_map>
#include <vector>

namespace torchbridge::recomputation {

class RecomputationRecord {
 public:
  RecomputationRecord() = default;
  RecomputationRecord(const RecomputationRecord&) = delete;
  RecomputationRecord& operator=(const RecomputationRecord&) = delete;

  enum class Phase {
    kForwardPass,    // values are recorded
    kRecomputation,  // values are replayed, from the first, each time one begins: a graph kept
                     // with retain_graph is recomputed again
  };

  // Puts this record on the calling thread's stack of active regions, in `phase`, for the scope's
  // lifetime: the region's forward pass or its recomputation.
  class Scope {
   public:
    Scope(RecomputationRecord& record, Phase phase);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RecomputationRecord* record_;
    Phase phase_;
  };

 private:
  friend std::optional<at::Tensor> replay(const void* key);
  friend void record(const void* key, const at::Tensor& value);

  std::unordered_map<const void*, std::vector<at::Tensor>> values_;
  std::unordered_map<const void*, std::size_t> replayed_;
};

// During a recomputation on this thread: the next value recorded under `key` by the forward pass
// being recomputed (c10::Error when the recomputation asks for more than the forward recorded:
// the region did not compute the same thing twice). Otherwise nullopt: compute and update as usual.
std::optional<at::Tensor> replay(const void* key);

// Whether a recomputation is running on this thread (a Scope in Phase::kRecomputation is active).
bool recomputing();

// Records a copy of `value` (the value the layer just used) under `key`, in every region whose
// forward pass is running on this thread, outside the innermost recomputation. Nothing when there is none.
void record(const void* key, const at::Tensor& value);

}  // namespace torchbridge::recomputation

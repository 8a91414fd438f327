#pragma once
// The validator's reference: the model on the CPU in float64 (float32 when it cannot run in
// float64), computed on a thread of its own while the backends run.

#include <torchbridge/validation/validator.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <future>
#include <string>
#include <vector>

namespace torchbridge::validation {

struct Reference {
  RunResult result;
  std::string description;
  double seconds = 0;
};

// The weights of the loss: standard normal from a seed, rounded to the compute precision (like
// the inputs, so a backend holds them exactly), as float64; drawn once per set of shapes and
// shared by the reference's thread and the backends (safe to call from both).
OutputWeights seeded_weights(uint64_t seed, c10::ScalarType compute);

// Places the reference's float64 copy on the calling thread (so nothing that touches a device
// happens on the reference's thread while backends measure their memory), then computes the
// reference on a thread of its own and returns. Its error (the model does not run on the CPU)
// comes out of get(). The thread carries the caller's
// thread-local state (grad mode, dispatch settings) and intra-op thread count; the future joins
// it when the last copy is destroyed, so `model` and `inputs` must outlive it.
std::shared_future<Reference> start_reference(const ModelSource& model, const std::vector<at::Tensor>& inputs,
                                              const OutputWeights& weights, c10::ScalarType storage);

}  // namespace torchbridge::validation

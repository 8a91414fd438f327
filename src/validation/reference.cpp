#include "validation/reference.h"

#include "validation/report_text.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace torchbridge::validation {

// The reference's thread and the backends draw from the same cache, hence the lock.
OutputWeights seeded_weights(uint64_t seed, c10::ScalarType compute) {
  struct Cache {
    std::mutex mutex;
    std::map<std::vector<std::vector<int64_t>>, std::vector<at::Tensor>> weights;
  };
  auto cache = std::make_shared<Cache>();
  return [seed, compute, cache](const std::vector<std::vector<int64_t>>& shapes) {
    const std::lock_guard<std::mutex> lock(cache->mutex);
    auto& weights = cache->weights[shapes];
    if (weights.empty()) {
      at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
      for (const auto& shape : shapes) {
        const at::Tensor w = at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble));
        weights.push_back(w.to(compute).to(at::kDouble));
      }
    }
    return weights;
  };
}

namespace {

// The model on the CPU in float64, or float32 when it cannot run in float64 (e.g. it casts
// internally), holding its parameters rounded to the compute precision. `float64` is the copy
// start_reference placed, or null with the reason in `float64_error` when placing it failed.
Reference run_reference(const ModelSource& model, std::unique_ptr<PlacedModel> float64, std::string float64_error,
                        const std::vector<at::Tensor>& inputs, const OutputWeights& weights,
                        c10::ScalarType storage, Clock::time_point start) {
  Reference reference;
  const auto finish = [&](std::string description) {
    reference.description = std::move(description);
    reference.seconds = seconds_since(start);
    return std::move(reference);
  };
  if (float64) {
    try {
      reference.result = float64->run(inputs, weights);
      return finish("cpu float64");
    } catch (const std::exception& e) {
      float64_error = error_summary(e.what());
    }
  }
  // Placed on this thread: only a model that does not run in float64 gets here.
  try {
    reference.result = model.place(c10::Device(c10::kCPU), at::kFloat, storage)->run(inputs, weights);
    return finish("cpu float32 (the model does not run in float64: " + float64_error + ")");
  } catch (const std::exception& e) {
    TORCH_CHECK_VALUE(false, "the model does not run on the CPU with inputs of shape ", shapes_of(inputs), ": ",
                      error_summary(e.what()));
  }
}

}  // namespace

// Started before the backends' runs and awaited only where a backend's results are compared with
// it: the CPU computes it while the devices run (on a GPU, the float64 reference alone took three
// times one forward+backward on the device). The float64 copy is placed here, on the calling
// thread, before any backend starts: a model that lives on a device is copied from that device
// (with temporaries there), and on the reference's thread those allocations would fall into a
// backend's memory window. The H200 run of 2026-11-26 saw exactly that: `portability` validates
// the model it trained on cuda, and the cuda window read "allocated 69022208 B -> 68928000 B".
std::shared_future<Reference> start_reference(const ModelSource& model, const std::vector<at::Tensor>& inputs,
                                              const OutputWeights& weights, c10::ScalarType storage) {
  const auto start = Clock::now();
  std::unique_ptr<PlacedModel> float64;
  std::string float64_error;
  try {
    float64 = model.place(c10::Device(c10::kCPU), at::kDouble, storage);
  } catch (const std::exception& e) {
    float64_error = error_summary(e.what());
  }
  return std::async(std::launch::async,
                    [&model, &inputs, weights, storage, start, float64 = std::move(float64),
                     float64_error = std::move(float64_error), state = at::ThreadLocalState()]() mutable {
                      const at::ThreadLocalStateGuard guard(state);
                      at::init_num_threads();
                      return run_reference(model, std::move(float64), std::move(float64_error), inputs, weights,
                                           storage, start);
                    })
      .share();
}

}  // namespace torchbridge::validation

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
// internally), holding its parameters rounded to the compute precision.
Reference run_reference(const ModelSource& model, const std::vector<at::Tensor>& inputs,
                        const OutputWeights& weights, c10::ScalarType storage) {
  const auto start = Clock::now();
  Reference reference;
  std::string float64_error;
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    try {
      auto placed = model.place(c10::Device(c10::kCPU), dtype, storage);
      reference.result = placed->run(inputs, weights);
      reference.description = dtype == at::kDouble
                                  ? "cpu float64"
                                  : "cpu float32 (the model does not run in float64: " + float64_error + ")";
      reference.seconds = seconds_since(start);
      return reference;
    } catch (const std::exception& e) {
      if (dtype == at::kDouble) {
        float64_error = error_summary(e.what());
        continue;
      }
      TORCH_CHECK_VALUE(false, "the model does not run on the CPU with inputs of shape ", shapes_of(inputs), ": ",
                        error_summary(e.what()));
    }
  }
  TORCH_CHECK(false, "unreachable");
}

}  // namespace

// Started before the backends' runs and awaited only where a backend's results are compared with
// it: the CPU computes it while the devices run (on a GPU, the float64 reference alone took three
// times one forward+backward on the device).
std::shared_future<Reference> start_reference(const ModelSource& model, const std::vector<at::Tensor>& inputs,
                                              const OutputWeights& weights, c10::ScalarType storage) {
  return std::async(std::launch::async,
                    [&model, &inputs, weights, storage, state = at::ThreadLocalState()] {
                      const at::ThreadLocalStateGuard guard(state);
                      at::init_num_threads();
                      return run_reference(model, inputs, weights, storage);
                    })
      .share();
}

}  // namespace torchbridge::validation

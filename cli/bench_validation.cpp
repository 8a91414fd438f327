// `torchbridge bench`'s validation group: what the validator costs against simply running the model.
#include "bench_cases.h"
#include "median_seconds.h"

#include <torchbridge/backend.h>
#include <torchbridge/precision.h>
#include <torchbridge/registry.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/validation/validator.h>

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::cli {

std::vector<BenchResult> bench_validation(const std::vector<std::string>& backends, const BenchOptions& options,
                                          const std::vector<int64_t>& input_shape, int intra_op_threads) {
  TORCH_CHECK_VALUE(!backends.empty(), "the validation benchmark needs at least one backend");
  TORCH_CHECK_VALUE(intra_op_threads >= 1, "the validation benchmark needs at least one intra-op thread, got ",
                    intra_op_threads);
  const int repeats = options.quick ? 3 : 9;
  std::string label;
  for (const auto& name : backends) label += (label.empty() ? "" : "+") + name;
  const IntraOpThreads threads(intra_op_threads);
  for (const auto& name : backends) create_backend(name);  // an SDK device loads before any backward pass

  const std::vector<int64_t> shape =
      input_shape.empty() ? validation::builtin_model_info("transformer").input_shape : input_shape;
  const torch::jit::Module model = validation::make_builtin_model("transformer");
  const at::Tensor input = at::randn(shape);
  if (options.progress) options.progress("validation " + label + ": forward+backward");
  double baseline = 0;
  for (const auto& name : backends) {
    const auto backend = create_backend(name);
    const c10::Device device = backend->device(0);
    torch::jit::Module copy = model.deepcopy();
    copy.to(device);
    for (auto p : copy.parameters()) p.detach_().requires_grad_(true);
    const at::Tensor x = input.to(device);
    baseline += median_seconds(repeats, [&] {
      // The validator runs TorchScript with the graph optimiser off (validation/torchscript_model.cpp);
      // the baseline runs the same way.
      torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
      for (auto p : copy.parameters()) p.mutable_grad() = at::Tensor();
      copy.forward({x}).toTensor().sum().backward();
      backend->synchronize(0);
    });
  }
  if (options.progress) options.progress("validation " + label + ": the validator");
  const validation::Validator validator({backends, Precision::kFp32});
  const auto source = validation::model_from(model);
  bool valid = true;
  double reference_seconds = 0;
  const double seconds = median_seconds(repeats, [&] {
    const auto report = validator.validate(*source, std::vector<std::vector<int64_t>>{shape});
    valid = report.is_valid() && valid;
    reference_seconds = report.reference_seconds;
  });
  char note[128];
  std::snprintf(note, sizeof(note), "report %s; of it the float64 reference %.3f ms", valid ? "valid" : "NOT valid",
                reference_seconds * 1e3);
  return {{"validation", label, "validate transformer " + c10::str(c10::IntArrayRef(shape)), "ms", "fwd+bwd on each",
           baseline * 1e3, seconds * 1e3, false, 3.0, note}};
}

}  // namespace torchbridge::cli

// Validator overhead: validating the built-in transformer on some backends (default: the CPU and
// emu) against simply running its forward and backward once on each of them, measured in one run.
// Goal: <= 3x. Both sides run the same TorchScript module; the baseline copies are placed before
// timing, and each figure is the median of several repetitions after a warm-up. The validator's
// own CPU float64 reference is part of its cost and is shown separately.
// Usage: validation_benchmark [--quick] [--input-shape B,T,F] [--backends LIST]
#include "median_seconds.h"

#include <torchbridge/registry.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/validation/validator.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace torchbridge;
  bool quick = false;
  std::vector<int64_t> shape = validation::builtin_model_info("transformer").input_shape;
  std::vector<std::string> backends = {"cpu", "emu"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--input-shape") == 0 && i + 1 < argc) {
      shape = validation::parse_shape(argv[++i]);
    } else if (std::strcmp(argv[i], "--backends") == 0 && i + 1 < argc) {
      backends.clear();
      std::stringstream list(argv[++i]);
      for (std::string name; std::getline(list, name, ',');) backends.push_back(name);
    } else {
      std::fprintf(stderr, "usage: validation_benchmark [--quick] [--input-shape B,T,F] [--backends LIST]\n");
      return 1;
    }
  }
  const int repeats = quick ? 3 : 9;
  std::string label;
  for (const auto& name : backends) label += (label.empty() ? "" : "+") + name;
  // One intra-op thread, as sdk_benchmark: on a small shared machine OpenMP's spinning threads
  // make multi-threaded timings swing by 100x whenever another process takes a core.
  at::set_num_threads(1);
  for (const auto& name : backends) create_backend(name);  // emu loads before any backward pass

  const torch::jit::Module model = validation::make_builtin_model("transformer");
  const at::Tensor input = at::randn(shape);

  std::printf("validation_benchmark: built-in transformer, input %s, torch %s, one run\n",
              c10::str(c10::IntArrayRef(shape)).c_str(), TORCH_VERSION);
  double baseline = 0;
  for (const auto& name : backends) {
    const c10::Device device = create_backend(name)->device(0);
    torch::jit::Module copy = model.deepcopy();
    copy.to(device);
    for (auto p : copy.parameters()) p.detach_().requires_grad_(true);
    const at::Tensor x = input.to(device);
    const double seconds = median_seconds(repeats, [&] {
      // The validator runs TorchScript with the graph optimiser off (validation/torchscript_model.cpp);
      // the baseline runs the same way, which on this torch is also the faster way (README).
      torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
      for (auto p : copy.parameters()) p.mutable_grad() = at::Tensor();
      copy.forward({x}).toTensor().sum().backward();
      create_backend(name)->synchronize(std::max<int>(0, device.index()));
    });
    std::printf("  forward+backward on %-4s %10.3f ms\n", name.c_str(), seconds * 1e3);
    baseline += seconds;
  }
  const validation::Validator validator({backends, Precision::kFp32});
  const auto source = validation::model_from(model);
  bool valid = true;
  double reference_seconds = 0;
  const double validation_seconds = median_seconds(repeats, [&] {
    const auto report = validator.validate(*source, std::vector<std::vector<int64_t>>{shape});
    valid = report.is_valid() && valid;
    reference_seconds = report.reference_seconds;
  });
  const double ratio = validation_seconds / baseline;
  std::printf("  validation on %-10s %10.3f ms (report %s; of it the CPU float64 reference %.3f ms)\n", label.c_str(),
              validation_seconds * 1e3, valid ? "valid" : "NOT valid", reference_seconds * 1e3);
  std::printf("validator overhead: %.2fx forward+backward on %s   goal <= 3x   %s\n", ratio, label.c_str(),
              ratio <= 3.0 ? "met" : "NOT met");
  return valid ? 0 : 1;
}

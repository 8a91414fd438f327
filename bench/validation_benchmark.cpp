// Validator overhead: validating the built-in transformer on some backends (default: the CPU and
// emu) against simply running its forward and backward once on each of them, measured in one run:
// the validation group of `torchbridge bench` (cli/bench_validation.cpp) on its own. Goal: <= 3x.
// Both sides run the same TorchScript module; the baseline copies are placed before timing, and
// each figure is the median of several repetitions after a warm-up. The validator's own CPU
// float64 reference is part of its cost and is shown separately.
// Usage: validation_benchmark [--quick] [--input-shape B,T,F] [--backends LIST]
#include "bench_cases.h"

#include <torchbridge/validation/validator.h>

#include <torch/version.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  torchbridge::cli::BenchOptions options;
  std::vector<int64_t> shape;
  std::vector<std::string> backends = {"cpu", "emu"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      options.quick = true;
    } else if (std::strcmp(argv[i], "--input-shape") == 0 && i + 1 < argc) {
      shape = torchbridge::validation::parse_shape(argv[++i]);
    } else if (std::strcmp(argv[i], "--backends") == 0 && i + 1 < argc) {
      backends.clear();
      std::stringstream list(argv[++i]);
      for (std::string name; std::getline(list, name, ',');) backends.push_back(name);
    } else {
      std::fprintf(stderr, "usage: validation_benchmark [--quick] [--input-shape B,T,F] [--backends LIST]\n");
      return 1;
    }
  }
  std::printf("validation_benchmark: torch %s, one intra-op thread\n\n", TORCH_VERSION);
  try {
    const auto results = torchbridge::cli::bench_validation(backends, options, shape);
    torchbridge::cli::print_bench_table(results);
    return results.front().note.rfind("report valid", 0) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "validation_benchmark: %s\n", e.what());
    return 1;
  }
}

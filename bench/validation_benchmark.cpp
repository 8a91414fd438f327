// Validator overhead: validating the built-in transformer on some backends (default: the CPU and
// emu) against simply running its forward and backward once on each of them, measured in one run:
// the validation group of `torchbridge bench` (cli/bench_validation.cpp) on its own. Goal: <= 3x.
// Both sides run the same TorchScript module; the baseline copies are placed before timing, and
// each figure is the median of several repetitions after a warm-up. The validator's own CPU
// float64 reference is part of its cost and is shown separately.
// Both sides run torch's CPU kernels on one intra-op thread unless --threads says otherwise:
// `--threads default` is torch's own count (the machine's cores), which `torchbridge validate`
// runs with. On a GPU the baseline is device work while the reference is CPU work, so one thread
// shows the reference at its slowest.
// Usage: validation_benchmark [--quick] [--input-shape B,T,F] [--backends LIST] [--threads N|default]
#include "bench_cases.h"

#include <torchbridge/validation/validator.h>

#include <ATen/Parallel.h>
#include <torch/version.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      options.quick = true;
    } else if (std::strcmp(argv[i], "--input-shape") == 0 && i + 1 < argc) {
      shape = torchbridge::validation::parse_shape(argv[++i]);
    } else if (std::strcmp(argv[i], "--backends") == 0 && i + 1 < argc) {
      backends.clear();
      std::stringstream list(argv[++i]);
      for (std::string name; std::getline(list, name, ',');) backends.push_back(name);
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      const std::string value = argv[++i];
      char* end = nullptr;
      const long count = value == "default" ? at::get_num_threads() : std::strtol(value.c_str(), &end, 10);
      if (count < 1 || count > 4096 || (end != nullptr && *end != '\0')) {
        std::fprintf(stderr, "validation_benchmark: --threads '%s' is not a thread count: expected a whole number "
                     "from 1 to 4096, or 'default'\n", value.c_str());
        return 1;
      }
      threads = static_cast<int>(count);
    } else {
      std::fprintf(stderr,
                   "usage: validation_benchmark [--quick] [--input-shape B,T,F] [--backends LIST] [--threads N|default]\n");
      return 1;
    }
  }
  std::printf("validation_benchmark: torch %s, %d intra-op thread(s)\n\n", TORCH_VERSION, threads);
  try {
    const auto results = torchbridge::cli::bench_validation(backends, options, shape, threads);
    torchbridge::cli::print_bench_table(results);
    return results.front().note.rfind("report valid", 0) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "validation_benchmark: %s\n", e.what());
    return 1;
  }
}

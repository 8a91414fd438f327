// Device SDK performance on `emu` against the same work on the CPU, measured in one run: the sdk
// group of `torchbridge bench` (cli/bench_sdk.cpp) on its own. Goals from the design:
//   small elementwise ops (1..1000 elements): emu time <= 3x CPU eager
//   1024x1024 float32 matmul:                 emu time <= 1.2x CPU
//   256 MiB host<->device copies:             emu bandwidth >= 0.8x memcpy
// Usage: sdk_benchmark [--quick]   (TORCHBRIDGE_EMU_GUARDED selects the emu memory mode)
#include "bench_cases.h"

#include <torch/version.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

int main(int argc, char** argv) {
  torchbridge::cli::BenchOptions options;
  options.quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const char* guarded = std::getenv("TORCHBRIDGE_EMU_GUARDED");
  std::printf("TorchBridge SDK benchmark: emu (guarded=%s) vs CPU eager, torch %s, 1 intra-op thread\n\n",
              guarded ? guarded : "1 (default)", TORCH_VERSION);
  try {
    torchbridge::cli::print_bench_table(torchbridge::cli::bench_sdk("emu", options));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdk_benchmark: %s\n", e.what());
    return 1;
  }
  return 0;  // a benchmark reports; it does not gate
}

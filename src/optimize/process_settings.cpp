#include "optimize/process_settings.h"

#include <ATen/Context.h>

#include <string>

namespace torchbridge::optimize_detail {

bool apply_process_setting(const PlannedStep& step) {
  at::Context& context = at::globalContext();
  if (step.name == "deterministic") {
    context.setDeterministicAlgorithms(true, /*warn_only=*/false);
    context.setDeterministicCuDNN(true);
    return true;
  }
  if (step.name == "tf32") {
    context.setAllowTF32CuBLAS(true);
    context.setAllowTF32CuDNN(true);
    return true;
  }
  if (step.name == "cudnn_benchmark") {
    context.setBenchmarkCuDNN(true);
    return true;
  }
  return false;
}

}  // namespace torchbridge::optimize_detail

#include "optimize/process_settings.h"

#include <ATen/Context.h>

#include <optional>
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
  if (step.name == "hardware.intel.enable_onednn") {  // applies only when set to false
    context.setUserEnabledMkldnn(false);
    return true;
  }
  if (step.name == "hardware.nvidia.flash_attention_version" && step.argument == "2") {
    context.setSDPUseFlash(true);
    return true;
  }
  return false;
}

std::optional<std::string> hardware_step_outside_cpp(const PlannedStep& step) {
  // Done elsewhere: the fp8 step, the constructor's architecture check and precision decision.
  if (step.name == "hardware.nvidia.fp8_enabled" || step.name == "hardware.amd.architecture" ||
      step.name == "hardware.amd.enable_matrix_cores") {
    return std::nullopt;
  }
  if (step.name == "hardware.nvidia.flash_attention_version") {
    return "FlashAttention-3 is activated through torch's Python API (torch.nn.attention); the Python package does it";
  }
  if (step.name == "hardware.nvidia.enable_oom_protection") {
    return "C++ modules have no forward to wrap; catch c10::OutOfMemoryError around your forward";
  }
  if (step.name == "hardware.amd.memory_pool_size_gb") {
    return "this library is not linked against c10_cuda/c10_hip; the Python package sets the memory fraction";
  }
  if (step.name == "hardware.intel.enable_ipex") return "intel_extension_for_pytorch is a Python package";
  return "the C++ executor does not carry out " + step.name;
}

}  // namespace torchbridge::optimize_detail

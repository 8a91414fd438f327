#pragma once
// The plan steps that are process-wide torch settings rather than changes to a model; shared by
// the C++ executors for torch::nn and TorchScript modules.

#include <torchbridge/optimize/plan.h>

#include <optional>
#include <string>

namespace torchbridge::optimize_detail {

// Applies `step` when it is one of deterministic, tf32, cudnn_benchmark,
// hardware.intel.enable_onednn, hardware.nvidia.flash_attention_version "2", and returns true;
// returns false for every other step.
bool apply_process_setting(const PlannedStep& step);

// For an applying hardware.* step the C++ executors do not carry out themselves: why, or nullopt
// when it needs nothing more (its effect is in another step or in the precision decision).
std::optional<std::string> hardware_step_outside_cpp(const PlannedStep& step);

}  // namespace torchbridge::optimize_detail

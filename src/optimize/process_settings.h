#pragma once
// The plan steps that are process-wide torch settings rather than changes to a model; shared by
// the C++ executors for torch::nn and TorchScript modules.

#include <torchbridge/optimize/plan.h>

namespace torchbridge::optimize_detail {

// Applies `step` when it is one of deterministic, tf32, cudnn_benchmark and returns true;
// returns false for every other step.
bool apply_process_setting(const PlannedStep& step);

}  // namespace torchbridge::optimize_detail

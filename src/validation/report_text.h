#pragma once
// Small pieces of the validator's report text: error lines, shapes, numbers, durations.

#include <torchbridge/error_summary.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace torchbridge::validation {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start);

using torchbridge::error_summary;  // the line of an error worth showing (torchbridge/error_summary.h)
// "[4, 16], [4]": the shapes of `inputs`, for messages.
std::string shapes_of(const std::vector<at::Tensor>& inputs);
std::string scientific(double value);  // three significant decimals
std::string format_bytes(int64_t bytes);

}  // namespace torchbridge::validation

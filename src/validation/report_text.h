#pragma once
// Small pieces of the validator's report text: error lines, shapes, numbers, durations.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace torchbridge::validation {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start);

// The line of an error worth showing: TorchScript's interpreter puts a generic first line and a
// script traceback before the original error, which comes last (before pybind's "At:" Python
// stack, when the error crossed a Python callback).
std::string error_summary(const std::string& text);
// "[4, 16], [4]": the shapes of `inputs`, for messages.
std::string shapes_of(const std::vector<at::Tensor>& inputs);
std::string scientific(double value);  // three significant decimals
std::string format_bytes(int64_t bytes);

}  // namespace torchbridge::validation

#pragma once
// The AMD Instinct generation in a device's marketing name, which HIP reports without a version
// field the ROCm backend may read (see rocm.cpp). Internal.

#include <string_view>

namespace torchbridge::adapters {

// "AMD Instinct MI300X" -> 300, "MI 250" -> 250; 0 when the name holds no "MI" followed
// (after optional white space) by two or three digits.
int instinct_generation(std::string_view marketing_name);

}  // namespace torchbridge::adapters

#pragma once
// Bookkeeping shared by every path that computes an operator on the CPU for the SDK device.

#include <string>

namespace torchbridge::sdk {
// Counts one CPU-fallback run of `op`; raises instead when TORCHBRIDGE_SDK_STRICT=1.
void note_cpu_fallback(const std::string& op);
}  // namespace torchbridge::sdk

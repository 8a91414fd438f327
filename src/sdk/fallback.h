#pragma once
// Bookkeeping shared by every path that computes an operator on the CPU for the SDK device.

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace torchbridge::sdk {
// Counts one CPU-fallback run of `op`; raises instead when TORCHBRIDGE_SDK_STRICT=1.
void note_cpu_fallback(const std::string& op);
// The same for a registered operator, counted under the key the boxed fallback uses (no names
// formatted on the hot path).
void note_cpu_fallback(const c10::OperatorHandle& op);
// The boxed CPU fallback (counted, strict-mode aware), for registrations beyond the dense key.
void boxed_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The fallback's path for operators with sparse arguments (sparse.cpp); false, stack untouched,
// when there are none.
bool run_sparse_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);
}  // namespace torchbridge::sdk

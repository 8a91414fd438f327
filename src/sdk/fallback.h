#pragma once
// Bookkeeping shared by every path that computes an operator on the CPU for the SDK device.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ArrayRef.h>

#include <string>
#include <string_view>

namespace torchbridge::sdk {
// Counts one CPU-fallback run of `op`; raises instead when TORCHBRIDGE_SDK_STRICT=1.
void note_cpu_fallback(const std::string& op);
// The same for a registered operator, counted under the key the boxed fallback uses (no names
// formatted on the hot path).
void note_cpu_fallback(const c10::OperatorHandle& op);
// The boxed CPU fallback (counted, strict-mode aware), for registrations beyond the dense key.
void boxed_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Torch's rule for every operator: its tensors live on one device (0-dim CPU tensors count as
// scalars; undefined tensors are skipped). Kernels that move their arguments to the host themselves
// check it first, or they would quietly compute across devices.
void check_tensors_on_one_device(std::string_view op, c10::ArrayRef<at::Tensor> tensors);
// The fallback's path for operators with sparse arguments (sparse.cpp); false, stack untouched,
// when there are none.
bool run_sparse_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);
}  // namespace torchbridge::sdk

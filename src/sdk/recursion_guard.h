#pragma once
// No operator may take the process down by recursing until the stack overflows. Two checks turn
// runaway recursion through the SDK device's kernels into a c10::Error naming the operator:
// a bound on how deeply the CPU fallback nests (it never legitimately nests more than a few
// levels: its CPU kernels see host tensors), and a stack-headroom check at the kernels every
// recursion that creates or copies device tensors passes through (allocation, _copy_from, the
// fallback), which also catches loops that never re-enter the fallback. Internal to the SDK glue.

#include <ATen/core/operator_name.h>

namespace torchbridge::sdk {

// The deepest the CPU fallback may nest on one thread.
constexpr int kMaxFallbackDepth = 32;

// Raises a c10::Error naming `op` when this thread's stack has less headroom left than it needs to
// report an error safely (a quarter of the stack, at most 1 MiB).
void check_stack_headroom(const char* op);

// Held by the CPU fallback while it runs `op`: counts nesting on this thread and raises, naming
// the operators on the nesting chain, once it exceeds kMaxFallbackDepth.
class FallbackDepthGuard {
 public:
  explicit FallbackDepthGuard(const c10::OperatorName& op);  // `op` lives as long as its registration
  ~FallbackDepthGuard();
  FallbackDepthGuard(const FallbackDepthGuard&) = delete;
  FallbackDepthGuard& operator=(const FallbackDepthGuard&) = delete;
};

}  // namespace torchbridge::sdk

#include "sdk/recursion_guard.h"

#include "sdk/runtime_handle.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace torchbridge::sdk {
namespace {

struct StackBounds {
  uintptr_t low = 0;  // lowest usable address (stacks grow down on every platform torch supports)
  size_t size = 0;
};

// Read once per thread: pthread_getattr_np is slow for the main thread (it parses /proc).
const StackBounds& this_thread_stack() {
  thread_local const StackBounds bounds = [] {
    StackBounds b;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* address = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &address, &size) == 0) {
        b.low = reinterpret_cast<uintptr_t>(address);
        b.size = size;
      }
      pthread_attr_destroy(&attr);
    }
    return b;
  }();
  return bounds;
}

thread_local std::vector<const c10::OperatorName*> fallback_chain;

std::string device_name() { return has_runtime() ? runtime().name() : std::string("(unregistered)"); }

// Bytes left below the current frame when that is less than the reserve an error report needs; 0 otherwise.
size_t stack_left_if_low() {
  const StackBounds& stack = this_thread_stack();
  if (stack.size == 0) return 0;  // bounds unknown: nothing to check against
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  const size_t reserve = std::min<size_t>(size_t{1} << 20, stack.size / 4);
  if (here < stack.low || here - stack.low >= reserve) return 0;
  return std::max<size_t>(here - stack.low, 1);
}

[[noreturn]] void raise_stack_exhausted(const std::string& op, size_t left) {
  TORCH_CHECK(false, "operator ", op, " on device '", device_name(),
              "' stopped: runaway recursion has used this thread's stack down to its last ", left / 1024, " KiB of ",
              this_thread_stack().size / 1024, " KiB (kernels calling each other without end); stopped before the "
              "stack overflows so the process survives. Please report it with this operator's name");
}

}  // namespace

void check_stack_headroom(const char* op) {
  if (const size_t left = stack_left_if_low()) raise_stack_exhausted(op, left);
}

FallbackDepthGuard::FallbackDepthGuard(const c10::OperatorName& op) {
  if (const size_t left = stack_left_if_low()) raise_stack_exhausted(c10::toString(op), left);
  if (static_cast<int>(fallback_chain.size()) >= kMaxFallbackDepth) {
    std::string chain;
    for (size_t i = fallback_chain.size() - 3; i < fallback_chain.size(); ++i) {
      chain += c10::toString(*fallback_chain[i]) + " -> ";
    }
    TORCH_CHECK(false, "operator ", c10::toString(op), " on device '", device_name(),
                "' stopped: the CPU fallback is nested ", fallback_chain.size(), " deep on this thread (limit ",
                kMaxFallbackDepth, "; innermost calls: ... ", chain, c10::toString(op),
                "), i.e. runaway recursion; stopped before the stack overflows so the process survives. Please "
                "report it with this operator's name");
  }
  fallback_chain.push_back(&op);
}

FallbackDepthGuard::~FallbackDepthGuard() { fallback_chain.pop_back(); }

}  // namespace torchbridge::sdk

#pragma once
// Stand-in for Gloo's context.h (see README.md). ProcessGroupGloo.hpp holds contexts by
// shared_ptr and, in an inline override this translation unit never emits, sets their timeout.

#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo

#pragma once
// What a failure inside c10d or Gloo says, for an error message of ours: a c10::Error's message
// without its C++ backtrace, or what() of anything else (gloo::IoException is a plain
// std::runtime_error). Internal to the distributed layer.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace torchbridge::distributed {

inline std::string failure_cause(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error != nullptr ? error->msg() : e.what();
}

}  // namespace torchbridge::distributed

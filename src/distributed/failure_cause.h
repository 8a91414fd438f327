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

// Whether a failure came from talking to other ranks (c10d's DistError family, or what Gloo's
// transport throws: plain std::runtime_errors), rather than from this rank's own work (any other
// c10::Error: a bad value, an assertion). Only the former is worth asking which rank was lost.
inline bool is_communication_failure(const std::exception& e) {
  if (dynamic_cast<const c10::DistError*>(&e) != nullptr) return true;
  return dynamic_cast<const c10::Error*>(&e) == nullptr;
}

}  // namespace torchbridge::distributed

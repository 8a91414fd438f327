#pragma once
// The message of the c10::Error `fn` raises, or "<no error>"; lets tests assert on the text.

#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace torchbridge::test_support {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.msg();
  }
  return "<no error>";
}

}  // namespace torchbridge::test_support

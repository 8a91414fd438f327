#pragma once
// EXPECT that `fn` raises a c10::Error whose message contains `expected`, printing the message
// when it does not.

#include "error_message.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace torchbridge::test_support {

inline void expect_error(const std::function<void()>& fn, const std::string& expected) {
  const std::string message = error_of(fn);
  EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in: " << message;
}

}  // namespace torchbridge::test_support

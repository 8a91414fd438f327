#pragma once
// Collects the c10 warnings (TORCH_WARN) raised on this thread while it lives, so a test can assert
// that a warning was given and what it said.

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace torchbridge::test_support {

class CollectWarnings : public c10::WarningHandler {
 public:
  CollectWarnings() : guard_(this) {}
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  bool any_contains(const std::string& text) const {
    for (const auto& m : messages) {
      if (m.find(text) != std::string::npos) return true;
    }
    return false;
  }
  std::string joined() const {
    std::string all;
    for (const auto& m : messages) all += m + "\n";
    return all;
  }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

}  // namespace torchbridge::test_support

#include <torchbridge/error_summary.h>

#include <sstream>
#include <string>

namespace torchbridge {

std::string error_summary(const std::string& text) {
  if (text.find("failed in the TorchScript interpreter") == std::string::npos) return text.substr(0, text.find('\n'));
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // An error raised in a Python callback (a Python model's run) reaches C++ with pybind's Python
    // stack after it, under a line "At:"; the error is the line before that stack.
    if (line == "At:") break;
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace torchbridge

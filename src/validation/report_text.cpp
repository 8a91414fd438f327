#include "validation/report_text.h"

#include <iomanip>
#include <memory>
#include <sstream>

namespace torchbridge::validation {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

std::string shapes_of(const std::vector<at::Tensor>& inputs) {
  std::ostringstream out;
  for (size_t i = 0; i < inputs.size(); ++i) out << (i ? ", " : "") << inputs[i].sizes();
  return out.str();
}

std::string scientific(double value) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(3) << value;
  return out.str();
}

std::string format_bytes(int64_t bytes) { return std::to_string(bytes) + " B"; }

}  // namespace torchbridge::validation

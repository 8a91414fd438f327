#include "validation/report_text.h"

#include <iomanip>
#include <memory>
#include <sstream>

namespace torchbridge::validation {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
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

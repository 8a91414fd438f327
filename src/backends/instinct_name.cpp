// Parsed by hand rather than with std::regex, like the device-name check (docs/device-sdk.md,
// "The Python-only crash of the first H100 run").
#include "backends/instinct_name.h"

#include <cstddef>

namespace torchbridge::adapters {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

}  // namespace

int instinct_generation(std::string_view marketing_name) {
  for (std::size_t at = marketing_name.find("MI"); at != std::string_view::npos;
       at = marketing_name.find("MI", at + 1)) {
    std::size_t pos = at + 2;
    while (pos < marketing_name.size() && is_space(marketing_name[pos])) ++pos;
    int generation = 0;
    int digits = 0;
    for (; digits < 3 && pos < marketing_name.size() && is_digit(marketing_name[pos]); ++digits, ++pos) {
      generation = generation * 10 + (marketing_name[pos] - '0');
    }
    if (digits >= 2) return generation;
  }
  return 0;
}

}  // namespace torchbridge::adapters

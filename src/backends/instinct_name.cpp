// Parsed by hand rather than with std::regex, like the device-name check (docs/device-sdk.md,
// "The Python-only crash of the GPU runs").
#include "backends/instinct_name.h"

#include <cctype>
#include <cstddef>

namespace torchbridge::adapters {

int instinct_generation(std::string_view marketing_name) {
  const auto byte = [&](std::size_t pos) { return static_cast<unsigned char>(marketing_name[pos]); };
  for (std::size_t at = marketing_name.find("MI"); at != std::string_view::npos;
       at = marketing_name.find("MI", at + 1)) {
    std::size_t pos = at + 2;
    while (pos < marketing_name.size() && std::isspace(byte(pos))) ++pos;
    int generation = 0;
    int digits = 0;
    for (; digits < 3 && pos < marketing_name.size() && std::isdigit(byte(pos)); ++digits, ++pos) {
      generation = generation * 10 + (byte(pos) - '0');
    }
    if (digits >= 2) return generation;
  }
  return 0;
}

}  // namespace torchbridge::adapters

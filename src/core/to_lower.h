#pragma once
// ASCII lower case, for names matched without regard to case (backends, dtypes, "auto").
// Internal to the library.

#include <algorithm>
#include <cctype>
#include <string>

namespace torchbridge::detail {

inline std::string to_lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace torchbridge::detail

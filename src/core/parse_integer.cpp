#include <torchbridge/parse_integer.h>

#include <c10/util/Exception.h>

#include <charconv>
#include <string>
#include <system_error>

namespace torchbridge {
namespace {

// from_chars over the whole text; false for anything but exactly one number.
template <typename T>
bool parse_whole(std::string_view text, T& value) {
  if (text.empty() || text.front() == '+') return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

int64_t parse_integer(std::string_view text, std::string_view what, int64_t min, int64_t max) {
  int64_t value = 0;
  const bool parsed = parse_whole(text, value);
  TORCH_CHECK_VALUE(parsed && value >= min && value <= max, what, " '", std::string(text),
                    "' is not a whole number from ", min, " to ", max);
  return value;
}

uint64_t parse_unsigned(std::string_view text, std::string_view what) {
  uint64_t value = 0;
  TORCH_CHECK_VALUE(!text.empty() && text.front() != '-' && parse_whole(text, value), what, " '", std::string(text),
                    "' is not a whole number from 0 to ", std::numeric_limits<uint64_t>::max());
  return value;
}

}  // namespace torchbridge

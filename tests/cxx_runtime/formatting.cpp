// What TorchBridge's libraries do with the C++ runtime all the time: format numbers into streams,
// match a pattern, throw and catch an exception whose message holds a number.
#include <cstring>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {
int copy_out(const std::string& text, char* out, int size) {
  std::strncpy(out, text.c_str(), static_cast<std::size_t>(size) - 1);
  out[size - 1] = '\0';
  return static_cast<int>(text.size());
}
}  // namespace

extern "C" int fixture_format(long value, char* out, int size) {
  std::ostringstream text;
  text << "device index " << value << " is out of range";
  return copy_out(text.str(), out, size);
}

extern "C" int fixture_matches(const char* name) {
  return std::regex_match(name, std::regex("[a-z][a-z0-9_]*")) ? 1 : 0;
}

extern "C" int fixture_throw_and_catch(long value, char* out, int size) {
  try {
    std::ostringstream text;
    text << "index " << value;
    throw std::out_of_range(text.str());
  } catch (const std::out_of_range& error) {
    return copy_out(error.what(), out, size);
  }
}

#include "optimize/flat_toml.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>

namespace torchbridge::optimize_detail {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool is_bare_key(std::string_view key) {
  if (key.empty()) return false;
  for (const char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// Bare keys joined by dots ("hardware.nvidia"), as TOML's dotted keys and table names are.
bool is_dotted_key(std::string_view key) {
  while (true) {
    const size_t dot = key.find('.');
    if (!is_bare_key(key.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    key.remove_prefix(dot + 1);
  }
}

class LineReader {
 public:
  LineReader(std::string_view source, size_t line) : source_(source), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const {
    TORCH_CHECK_VALUE(false, source_, " line ", line_, ": ", what);
  }

  // A string value starting at text[0] (a quote); returns the value, leaves `rest` after it.
  std::string read_string(std::string_view text, std::string_view& rest) const {
    const char quote = text[0];
    if (text.substr(0, 3) == std::string(3, quote)) fail("multi-line strings are not supported");
    std::string value;
    for (size_t i = 1; i < text.size(); ++i) {
      const char c = text[i];
      if (c == quote) {
        rest = text.substr(i + 1);
        return value;
      }
      if (c == '\\' && quote == '"') {
        if (++i == text.size()) break;
        switch (text[i]) {
          case '"': value += '"'; break;
          case '\\': value += '\\'; break;
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          default: fail(std::string("unsupported escape \\") + text[i] + " in a string");
        }
        continue;
      }
      value += c;
    }
    fail("unterminated string");
  }

  nlohmann::json read_value(std::string_view text) const {
    if (text.empty()) fail("a value is missing after '='");
    std::string_view rest;
    nlohmann::json value;
    if (text[0] == '"' || text[0] == '\'') {
      value = read_string(text, rest);
    } else {
      const size_t end = text.find('#');
      const std::string_view token = trim(text.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view() : text.substr(end);
      if (token == "true" || token == "false") {
        value = token == "true";
      } else if (!token.empty() && (token[0] == '[' || token[0] == '{')) {
        fail("arrays and inline tables are not supported; the configuration has only plain values");
      } else {
        int64_t integer = 0;
        const auto [end_int, error] = std::from_chars(token.data(), token.data() + token.size(), integer);
        if (error == std::errc() && end_int == token.data() + token.size()) {
          value = integer;
        } else {
          double number = 0;
          const auto [end_float, float_error] = std::from_chars(token.data(), token.data() + token.size(), number);
          if (float_error != std::errc() || end_float != token.data() + token.size()) {
            fail("'" + std::string(token) + "' is not a string, integer, float or boolean");
          }
          value = number;
        }
      }
    }
    rest = trim(rest);
    if (!rest.empty() && rest[0] != '#') fail("unexpected text after the value: '" + std::string(rest) + "'");
    return value;
  }

 private:
  std::string_view source_;
  size_t line_;
};

}  // namespace

nlohmann::json parse_flat_toml(std::string_view text, std::string_view source) {
  nlohmann::json document = nlohmann::json::object();
  std::string table;  // the current [table]'s name; "" before the first
  size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    const std::string_view line = trim(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty() || line[0] == '#') continue;
    const LineReader reader(source, line_number);
    if (line[0] == '[') {
      // A table header names the prefix of the keys after it: [hardware.nvidia].
      const size_t close = line.find(']');
      if (line.starts_with("[[") || close == std::string_view::npos || !trim(line.substr(close + 1)).empty() ||
          !is_dotted_key(trim(line.substr(1, close - 1)))) {
        reader.fail("expected a table header such as [hardware.nvidia] (arrays of tables are not supported)");
      }
      table = std::string(trim(line.substr(1, close - 1)));
      continue;
    }
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos) reader.fail("expected 'key = value'");
    const std::string name(trim(line.substr(0, equals)));
    if (!is_dotted_key(name)) reader.fail("'" + name + "' is not a bare or dotted key (letters, digits, '_', '-', '.')");
    // The result is flat: "hardware.nvidia.fp8_enabled" keys, which the configuration reads as
    // it reads nested objects.
    const std::string key = table.empty() ? name : table + "." + name;
    if (document.contains(key)) reader.fail("key '" + key + "' appears twice");
    document[key] = reader.read_value(trim(line.substr(equals + 1)));
  }
  return document;
}

}  // namespace torchbridge::optimize_detail

#include "text_format.h"

#include <cstdio>

namespace torchbridge::cli {

std::string format_bytes(std::optional<int64_t> bytes) {
  if (!bytes) return "-";
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(*bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buffer;
}

std::string yes_no(bool value) { return value ? "yes" : "no"; }

std::string column(const std::string& text, size_t width) {
  if (text.size() >= width) return text.substr(0, width - 1) + " ";
  return text + std::string(width - text.size(), ' ');
}

std::string fixed(double value, int digits) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

std::string scientific(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2e", value);
  return buffer;
}

}  // namespace torchbridge::cli

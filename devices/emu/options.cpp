// Parsing of TORCHBRIDGE_EMU_* values. Every rejection names the variable, repeats the value and
// says what would have been accepted, because the sentence is all a user sees of a failed load.
#include "options.h"

#include <array>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>

namespace torchbridge::emu {
namespace {

constexpr int kMaxDevices = 64;
constexpr std::uint64_t kMaxLatencyUs = 10'000'000;  // 10 s: larger values are almost surely a unit mistake

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// Digits only (no sign, no spaces); false on anything else or on overflow of uint64.
bool parse_decimal(std::string_view digits, std::uint64_t* value) {
  if (digits.empty()) return false;
  std::uint64_t result = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
    if (result > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return false;
    result = result * 10 + digit;
  }
  *value = result;
  return true;
}

std::string quoted(const char* name, std::string_view value) {
  return std::string(name) + "='" + std::string(value) + "'";
}

// An unset or empty variable means "use the default", as TORCHBRIDGE_BACKEND does.
std::optional<std::string_view> value_of(const char* (*lookup)(const char*), const char* name) {
  const char* raw = lookup(name);
  if (raw == nullptr) return std::nullopt;
  const std::string_view value = trim(raw);
  if (value.empty()) return std::nullopt;
  return value;
}

bool parse_devices(std::string_view value, EmuOptions& options, std::string& error) {
  std::uint64_t count = 0;
  if (!parse_decimal(value, &count) || count < 1 || count > kMaxDevices) {
    error = quoted("TORCHBRIDGE_EMU_DEVICES", value) +
            " is not a valid device count: expected a whole number from 1 to " + std::to_string(kMaxDevices);
    return false;
  }
  options.device_count = static_cast<int>(count);
  return true;
}

bool parse_memory(std::string_view value, EmuOptions& options, std::string& error) {
  static constexpr const char* kExpected =
      "expected a positive whole number of bytes with an optional suffix K, M, G, KiB, MiB or GiB "
      "(powers of 1024), e.g. 1073741824, 512M or 2GiB";
  struct Suffix {
    std::string_view text;
    unsigned shift;
  };
  // Longer suffixes first so "KiB" is not read as "Ki" + "B".
  static constexpr std::array<Suffix, 6> kSuffixes = {{
      {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"K", 10}, {"M", 20}, {"G", 30}}};

  std::string_view digits = value;
  unsigned shift = 0;
  for (const Suffix& suffix : kSuffixes) {
    if (digits.size() > suffix.text.size() &&
        equals_ignoring_case(digits.substr(digits.size() - suffix.text.size()), suffix.text)) {
      digits.remove_suffix(suffix.text.size());
      shift = suffix.shift;
      break;
    }
  }
  std::uint64_t number = 0;
  if (!parse_decimal(digits, &number)) {
    error = quoted("TORCHBRIDGE_EMU_MEMORY", value) + " is not a valid capacity: " + kExpected;
    return false;
  }
  if (number == 0) {
    error = quoted("TORCHBRIDGE_EMU_MEMORY", value) +
            " asks for a capacity of zero bytes per device, which could hold nothing: " + kExpected;
    return false;
  }
  // Keep the capacity well inside the 47-bit user address space: every device maps it twice.
  constexpr std::uint64_t kMaxCapacity = std::uint64_t{1} << 40;  // 1 TiB
  if (number > (kMaxCapacity >> shift)) {
    error = quoted("TORCHBRIDGE_EMU_MEMORY", value) +
            " is too large: the emulator accepts at most 1 TiB (1024G) per device";
    return false;
  }
  options.memory_capacity_bytes = number << shift;
  return true;
}

bool parse_guarded(std::string_view value, EmuOptions& options, std::string& error) {
  if (value == "1" || value == "0") {
    options.guarded = value == "1";
    return true;
  }
  error = quoted("TORCHBRIDGE_EMU_GUARDED", value) +
          " is not valid: expected 1 (device memory faults when host code touches it) or 0 "
          "(device pointers are ordinary host memory)";
  return false;
}

bool parse_latency(std::string_view value, EmuOptions& options, std::string& error) {
  std::uint64_t microseconds = 0;
  if (!parse_decimal(value, &microseconds) || microseconds > kMaxLatencyUs) {
    error = quoted("TORCHBRIDGE_EMU_LATENCY_US", value) +
            " is not valid: expected a whole number of microseconds from 0 to " + std::to_string(kMaxLatencyUs);
    return false;
  }
  options.latency = std::chrono::microseconds(microseconds);
  return true;
}

bool parse_fault(std::string_view value, EmuOptions& options, std::string& error) {
  for (FaultMode mode : {FaultMode::none, FaultMode::drop_copy, FaultMode::corrupt_copy, FaultMode::leak}) {
    if (equals_ignoring_case(value, fault_mode_name(mode))) {
      options.fault = mode;
      return true;
    }
  }
  error = quoted("TORCHBRIDGE_EMU_FAULT", value) +
          " is not a known fault: expected one of none, drop-copy, corrupt-copy, leak";
  return false;
}

const char* getenv_lookup(const char* name) { return std::getenv(name); }

}  // namespace

const char* fault_mode_name(FaultMode mode) {
  switch (mode) {
    case FaultMode::none: return "none";
    case FaultMode::drop_copy: return "drop-copy";
    case FaultMode::corrupt_copy: return "corrupt-copy";
    case FaultMode::leak: return "leak";
  }
  return "none";
}

OptionsOrError read_options(const char* (*lookup)(const char* name)) {
  if (lookup == nullptr) lookup = getenv_lookup;
  using Parser = bool (*)(std::string_view, EmuOptions&, std::string&);
  static constexpr std::array<std::pair<const char*, Parser>, 5> kVariables = {{
      {"TORCHBRIDGE_EMU_DEVICES", parse_devices},
      {"TORCHBRIDGE_EMU_MEMORY", parse_memory},
      {"TORCHBRIDGE_EMU_GUARDED", parse_guarded},
      {"TORCHBRIDGE_EMU_LATENCY_US", parse_latency},
      {"TORCHBRIDGE_EMU_FAULT", parse_fault},
  }};

  OptionsOrError result;
  EmuOptions options;
  for (const auto& [name, parse] : kVariables) {
    if (const auto value = value_of(lookup, name); value && !parse(*value, options, result.error)) {
      return result;
    }
  }
  result.options = options;
  return result;
}

}  // namespace torchbridge::emu

#pragma once
// The TOML a configuration needs, read into flat JSON: `key = value` with basic or literal
// strings, integers, floats and booleans, dotted keys and [table] headers (both become dotted
// keys: {"hardware.nvidia.fp8_enabled": true}), `#` comments, blank lines. Arrays, inline tables,
// arrays of tables, dates and multi-line strings are refused naming the line, rather than half-read. No TOML library is
// packaged for every platform we build on, and the configuration schema needs no more.

#include <nlohmann/json.hpp>

#include <string_view>

namespace torchbridge::optimize_detail {

// Raises c10::ValueError naming `source`, the line number and what was expected.
nlohmann::json parse_flat_toml(std::string_view text, std::string_view source);

}  // namespace torchbridge::optimize_detail

#pragma once
// Helpers for the CLI's human-readable output.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::cli {

// "23.4 GiB", "512 B"; "-" when unknown.
std::string format_bytes(std::optional<int64_t> bytes);
std::string yes_no(bool value);
// Pads `text` to `width` columns; a longer text is kept whole, followed by one space.
std::string column(const std::string& text, size_t width);
// "a, b, c".
std::string comma_separated(const std::vector<std::string>& items);
// "1.23" with `digits` decimals; "4.56e-07" (three significant digits) for measured errors.
std::string fixed(double value, int digits);
std::string scientific(double value);
// `text` with control characters written as escapes ("\n", "\x1b"): names and metadata from a
// file, which could otherwise forge lines of a listing.
std::string visible(const std::string& text);

}  // namespace torchbridge::cli

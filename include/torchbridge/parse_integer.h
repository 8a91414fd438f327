#pragma once
// One integer parser for every number a user or a file hands TorchBridge as text (command-line
// values, shapes, checkpoint metadata): the whole text must be a base-10 integer inside
// [min, max]. Anything else — empty, a sign where none fits, trailing text, out of range —
// raises c10::ValueError naming `what`, the text and the accepted range.

#include <cstdint>
#include <limits>
#include <string_view>

namespace torchbridge {

int64_t parse_integer(std::string_view text, std::string_view what,
                      int64_t min = std::numeric_limits<int64_t>::min(),
                      int64_t max = std::numeric_limits<int64_t>::max());

// The same for values that may use all 64 unsigned bits (seeds).
uint64_t parse_unsigned(std::string_view text, std::string_view what);

}  // namespace torchbridge

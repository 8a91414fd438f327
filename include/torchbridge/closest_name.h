#pragma once
// "Did you mean ...?" for names a user types: configuration keys, environment variables. A near
// miss is at most max(2, a quarter of the name's length) single-character edits away.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace torchbridge {

// Levenshtein distance: insertions, deletions and substitutions of one character each.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name` when it is a near miss, otherwise "" (also for an exact match,
// which is no miss at all, and for no candidates). Ties go to the earlier candidate.
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace torchbridge

#pragma once
// JSON parsed with a bound on nesting and every object's keys unique. nlohmann keeps the last of
// two equal keys silently; a file header or a configuration that says one thing twice is refused.

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace torchbridge::detail {

enum class JsonProblem { duplicate_key, too_deep };

// Called with the problem, the key (for a duplicate) and the keys leading to the object that holds
// it (empty: the top-level object; {"a"}: the object under "a"); it must throw, naming the source.
// Malformed text raises nlohmann::json::parse_error as usual.
using JsonProblemHandler =
    std::function<void(JsonProblem problem, const std::string& key, const std::vector<std::string>& enclosing_keys)>;

nlohmann::json parse_json_strictly(std::string_view text, int max_depth, const JsonProblemHandler& on_problem);

}  // namespace torchbridge::detail

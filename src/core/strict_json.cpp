#include "core/strict_json.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace torchbridge::detail {

nlohmann::json parse_json_strictly(std::string_view text, int max_depth, const JsonProblemHandler& on_problem) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> keys_per_object;
  // The key being read in each open object; all but the innermost lead to it.
  std::vector<std::string> current_keys;
  const auto enclosing = [&] {
    return std::vector<std::string>(current_keys.begin(), current_keys.end() - (current_keys.empty() ? 0 : 1));
  };
  const auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) on_problem(JsonProblem::too_deep, "", enclosing());
    if (event == json::parse_event_t::object_start) {
      keys_per_object.emplace_back();
      current_keys.emplace_back();
    }
    if (event == json::parse_event_t::object_end && !keys_per_object.empty()) {
      keys_per_object.pop_back();
      current_keys.pop_back();
    }
    if (event == json::parse_event_t::key && !keys_per_object.empty()) {
      std::string key = parsed.get<std::string>();
      current_keys.back() = key;
      if (!keys_per_object.back().insert(key).second) on_problem(JsonProblem::duplicate_key, key, enclosing());
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback);
}

}  // namespace torchbridge::detail

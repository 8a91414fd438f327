#include "core/strict_json.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace torchbridge::detail {

nlohmann::json parse_json_strictly(std::string_view text, int max_depth, const JsonProblemHandler& on_problem) {
  using json = nlohmann::json;
  // One entry per open object: the keys it has had so far and the one being read.
  struct OpenObject {
    std::set<std::string> keys;
    std::string current_key;
  };
  std::vector<OpenObject> open_objects;
  // The keys leading to the innermost open object (its own key excluded).
  const auto enclosing = [&] {
    std::vector<std::string> path;
    for (size_t i = 0; i + 1 < open_objects.size(); ++i) path.push_back(open_objects[i].current_key);
    return path;
  };
  const auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) on_problem(JsonProblem::too_deep, "", enclosing());
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == json::parse_event_t::key && !open_objects.empty()) {
      std::string key = parsed.get<std::string>();
      open_objects.back().current_key = key;
      if (!open_objects.back().keys.insert(key).second) on_problem(JsonProblem::duplicate_key, key, enclosing());
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback);
}

}  // namespace torchbridge::detail

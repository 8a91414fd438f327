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
  const auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) on_problem(JsonProblem::too_deep, "", depth);
    if (event == json::parse_event_t::object_start) keys_per_object.emplace_back();
    if (event == json::parse_event_t::object_end && !keys_per_object.empty()) keys_per_object.pop_back();
    if (event == json::parse_event_t::key && !keys_per_object.empty()) {
      std::string key = parsed.get<std::string>();
      if (!keys_per_object.back().insert(key).second) on_problem(JsonProblem::duplicate_key, key, depth);
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback);
}

}  // namespace torchbridge::detail

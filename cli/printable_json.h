#pragma once
// JSON text for the CLI's output. Paths, tensor names and environment values are bytes that need
// not be UTF-8, which JSON text must be; nlohmann's plain dump() throws on them, and a whole report
// (a checkpoint's, a training run's) was lost over one name. Invalid bytes become U+FFFD instead.

#include <nlohmann/json.hpp>

#include <string>

namespace torchbridge::cli {

template <typename Json>
std::string printable_json(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace torchbridge::cli

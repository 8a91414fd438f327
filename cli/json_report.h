#pragma once
// The CLI's JSON encoding of backend-layer types (schema documented in docs/cli-json.md).

#include <torchbridge/backend.h>
#include <torchbridge/device_info.h>
#include <torchbridge/memory_stats.h>

#include <nlohmann/json.hpp>

namespace torchbridge::cli {

nlohmann::json to_json(const DeviceInfo& info);
nlohmann::json to_json(const MemoryStats& stats);

}  // namespace torchbridge::cli

#pragma once
// The JSON documents of the backend layer's types, exactly as `torchbridge info --json` prints them
// (schema in docs/cli-json.md), for every front end: the CLI embeds them in its reports, the Python
// package parses them into its dataclasses. Text, so no JSON library leaks into the public headers.

#include <torchbridge/device_info.h>
#include <torchbridge/memory_stats.h>
#include <torchbridge/precision_policy.h>

#include <string>
#include <vector>

namespace torchbridge {

// `indent` < 0: one line; otherwise pretty-printed with that many spaces.
std::string to_json_text(const DeviceInfo& info, int indent = -1);
std::string to_json_text(const MemoryStats& stats, int indent = -1);
// The precision policy for one device: the decision for `decision.requested` and how the device
// runs every precision ({"requested", "precision", "support", "device", "reason", "capabilities"}).
std::string to_json_text(const PrecisionDecision& decision, const std::vector<PrecisionCapability>& capabilities,
                         int indent = -1);

}  // namespace torchbridge

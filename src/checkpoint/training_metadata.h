#pragma once
// The training state's `__metadata__`: read and checked as a whole before a restore touches
// anything, so a truncated or crafted file gives an error naming the file and the key instead of
// undefined behaviour (nlohmann's operator[] on a missing key of a const object is undefined).

#include <torchbridge/amp/grad_scaler_state.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace torchbridge::checkpoint {

inline constexpr const char* kTrainingStateFormat = "torchbridge.training_state/1";

struct TrainingMetadata {
  int64_t step = 0;
  int64_t epoch = 0;
  // {"type": a known optimizer, "groups": [{hyper-parameters..., "size": parameter count}]},
  // every field present with its JSON type (checked by the type's codec).
  nlohmann::json optimizer;
  std::map<std::string, std::string> user;  // "user.<key>" entries, prefix removed
  std::optional<amp::GradScalerState> grad_scaler;  // "torchbridge.grad_scaler", when present
  std::string lr_scheduler;                         // "torchbridge.lr_scheduler" (a JSON object), or empty
};

// The metadata entries for a GradScaler state: torch's state_dict as JSON, and back.
std::string grad_scaler_to_json(const amp::GradScalerState& state);

// Raises ValueError naming `path`, the key and what is wrong.
TrainingMetadata read_training_metadata(const std::map<std::string, std::string>& metadata, const std::string& path);

}  // namespace torchbridge::checkpoint

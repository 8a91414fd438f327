#pragma once
// A GradScaler's saved state, in a header of its own so that the training state
// (checkpoint/training_state.h) can carry one without the scaler's class and ATen.

#include <cstdint>

namespace torchbridge::amp {

// What torch's state_dict holds, under the same names: "scale", "growth_factor",
// "backoff_factor", "growth_interval", "_growth_tracker".
struct GradScalerState {
  double scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  int64_t growth_interval = 0;
  int64_t growth_tracker = 0;
};

}  // namespace torchbridge::amp

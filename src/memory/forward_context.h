#pragma once
// What a checkpointed region's forward pass ran under and its recomputation must run under again:
// the random generators' states (so dropout draws the same mask) and autocast's settings (so the
// same operators run in the same lower precision). Captured when the region starts; replayed by
// RAII guards during backward that put back whatever was current afterwards.

#include <torchbridge/amp/autocast_scope.h>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <vector>

namespace torchbridge::memory::detail {

struct GeneratorState {
  at::Generator generator;
  at::Tensor state;
};

// The default generators' states of the CPU and of every device the inputs live on.
std::vector<GeneratorState> capture_random_state(const std::vector<at::Tensor>& inputs);

// Sets each recorded generator to its recorded state; on destruction, sets it back to the state
// it had when the replay began (the backward pass must not change the program's random stream).
class RandomStateReplay {
 public:
  explicit RandomStateReplay(const std::vector<GeneratorState>& recorded);
  ~RandomStateReplay();
  RandomStateReplay(const RandomStateReplay&) = delete;
  RandomStateReplay& operator=(const RandomStateReplay&) = delete;

 private:
  std::vector<GeneratorState> current_;
};

struct AutocastSetting {
  c10::DeviceType device_type;
  bool enabled;
  c10::ScalarType dtype;
};

struct AutocastState {
  std::vector<AutocastSetting> settings;  // one per device type torch has autocast for
  bool cache_enabled = true;
};

AutocastState capture_autocast_state();

// Scopes that put the recorded settings in force for device types where autocast is on now or was
// on then (destroy them to restore): the backward pass usually runs outside the user's autocast
// region, while the recomputation must run inside an equivalent one.
std::vector<std::unique_ptr<amp::AutocastScope>> replay_autocast_state(const AutocastState& recorded);

}  // namespace torchbridge::memory::detail

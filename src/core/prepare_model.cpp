// Kept in its own translation unit: torch/nn/module.h is the most expensive header we use.
#include <torchbridge/backend.h>

#include <torch/nn/module.h>

namespace torchbridge {

void Backend::prepare_model(torch::nn::Module& module, OptLevel level, int index) const {
  const c10::Device target = device(index);
  require_supported_opt_level(level);
  module.to(target);
}

}  // namespace torchbridge

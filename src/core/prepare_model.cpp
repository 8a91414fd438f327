// Kept in its own translation unit: torch/nn/module.h is the most expensive header we use.
#include <torchbridge/backend.h>

#include <torch/nn/module.h>

namespace torchbridge {

void Backend::prepare_model(torch::nn::Module& module, OptLevel level, int index) const {
  const c10::Device target = device(index);
  TORCH_CHECK_NOT_IMPLEMENTED(level == OptLevel::O0, "optimization level ", to_string(level),
                              " is not yet supported by TorchBridge (only O0 exists so far); "
                              "refusing to run O0 in its place");
  module.to(target);
}

}  // namespace torchbridge

// Backend::prepare_model's O1-O3: a UnifiedManager for that backend and level. Installed when
// libtorchbridge loads: every program that can call prepare_model links this layer too, so
// nothing has to remember an init call (the SDK's name resolver works the same way).
#include <torchbridge/backend.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/optimize/manager.h>

#include <torch/nn/module.h>

#include <string>

namespace torchbridge {
namespace {

PreparedModel prepare_with_manager(const Backend& backend, torch::nn::Module& module, OptLevel level, int index) {
  TorchBridgeConfig config;
  config.backend = backend.name();
  config.device_index = index;
  config.optimization_level = level;
  config.training = module.is_training();
  UnifiedManager manager(config);
  manager.optimize(module);
  return {manager.autocast_dtype()};
}

const bool installed = [] {
  set_model_preparer(&prepare_with_manager);
  return true;
}();

}  // namespace
}  // namespace torchbridge

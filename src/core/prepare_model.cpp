// Kept in its own translation unit: torch/nn/module.h is the most expensive header we use.
#include <torchbridge/backend.h>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <atomic>

namespace torchbridge {
namespace {

std::atomic<ModelPreparer>& installed_preparer() {
  static std::atomic<ModelPreparer> preparer{nullptr};
  return preparer;
}

}  // namespace

void set_model_preparer(ModelPreparer preparer) { installed_preparer().store(preparer); }

PreparedModel Backend::prepare_model(torch::nn::Module& module, OptLevel level, int index) const {
  const c10::Device target = device(index);  // checks availability and the index first
  if (level == OptLevel::O0) {
    module.to(target);
    return {};
  }
  const ModelPreparer preparer = installed_preparer().load();
  // Always installed in libtorchbridge; a build without the optimize layer would fail here
  // rather than run O0 in place of the level asked for.
  TORCH_CHECK_NOT_IMPLEMENTED(preparer != nullptr, "optimization level ", to_string(level),
                              " needs the optimize layer, which this build of libtorchbridge lacks");
  return preparer(*this, module, level, index);
}

}  // namespace torchbridge

// Quantized tensors cannot live on SDK devices: a quantized tensor carries its quantizer in a
// QTensorImpl that torch only builds for its own backends, and the runtime interface has nothing to
// describe one. Without this, every quantized operator on the device died in the dispatcher's
// generic "Could not run ... from the 'Quantized<device>' backend"; this fallback says what is
// unsupported and what to do instead.
#include "sdk/registration.h"

#include "sdk/runtime_handle.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

void refuse_quantized(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "operator ", c10::toString(op.operator_name()), " on device '", runtime().name(),
                              "': quantized tensors are not supported on TorchBridge SDK devices (dense and sparse "
                              "layouts are); quantize and run quantized operators on the CPU, or dequantize() "
                              "before moving to '", runtime().name(), "'");
}

}  // namespace

void register_quantized_refusal() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::QuantizedPrivateUse1, __FILE__, __LINE__);
  library->fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_quantized>());
}

}  // namespace torchbridge::sdk

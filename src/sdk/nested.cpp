// Nested tensors of the strided layout (torch.nested.nested_tensor's default) cannot live on SDK
// devices: torch builds one on the device, but every operator on it then died in the dispatcher's
// generic "Could not run ... from the 'NestedTensor<device>' backend", printing and .to("cpu")
// included. This fallback names what is unsupported and the ways that work. The jagged layout is
// a Python subclass over plain tensors and does not come here.
#include "sdk/registration.h"

#include "sdk/runtime_handle.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

void refuse_nested(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "operator ", c10::toString(op.operator_name()), " on device '", runtime().name(),
                              "': nested tensors of the strided layout are not supported on TorchBridge SDK devices; "
                              "use layout=torch.jagged (torch.nested.nested_tensor(..., layout=torch.jagged)), or "
                              "keep strided nested tensors on the CPU");
}

}  // namespace

void register_nested_refusal() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);
  library->fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_nested>());
}

}  // namespace torchbridge::sdk

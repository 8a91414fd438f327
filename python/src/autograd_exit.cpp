// Waiting, at interpreter exit, for autograd's device threads to let go of the last backward pass.
//
// torch's Python backward() stashes a contextvars.Context in thread-local state
// (torch/autograd/graph.py, _engine_run_backward, torch 2.13), and the autograd GraphTask keeps a
// copy of that state. On an accelerator the task finishes on the engine's device thread, which
// releases its reference only after it has woken the caller. A program that exits right after
// backward() can therefore reach interpreter finalization while that thread is still letting go:
// dropping the Context takes the GIL, Python ends the thread with pthread_exit from inside a
// destructor, and the process aborts ("terminate called without an active exception"). Under load
// this happened in about 3% of runs of a five-line training script on emu.
//
// A device thread runs one task at a time and drops the previous task before taking the next. So a
// tiny backward pass per device index, run before finalization with the GIL released (the thread
// may need it to drop what it holds), returns only once each thread is done with the user's graphs.
// The probe's own graph is built here in C++ and holds no Python object.

#include <torchbridge/sdk/device.h>

#include <ATen/ops/ones.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <pybind11/pybind11.h>

#include <optional>

namespace py = pybind11;

namespace torchbridge::python {
namespace {

// Returns the number of device threads waited for: one per index of the registered SDK device,
// 0 when none is registered.
int drain_autograd_device_threads() {
  if (!sdk::registered_device()) return 0;
  py::gil_scoped_release no_gil;
  const c10::InferenceMode not_inference(false);  // the program may end inside inference_mode
  const c10::AutoGradMode grad_enabled(true);     // or with grad disabled
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  const int count = guard->deviceCount();
  for (int index = 0; index < count; ++index) {
    const auto options = at::TensorOptions().device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
    const at::Tensor leaf = at::ones({}, options).requires_grad_(true);
    // A device loaded after the process's first backward pass has indices autograd never
    // served (sdk::autograd_refusal): no backward ran there, so there is nothing to wait for.
    try {
      // A view: its backward needs no operator of the device's own (with TORCHBRIDGE_SDK_STRICT=1 the
      // CPU fallback is forbidden, and the program's exit printed that aten::mul had no kernel).
      torch::autograd::backward({leaf.view({1})}, {at::ones({1}, options)});
    } catch (const c10::Error&) {
      if (sdk::autograd_refusal()) return index;
      throw;
    }
  }
  return count;
}

}  // namespace

void bind_autograd_exit(py::module_& m) {
  m.def("drain_autograd_device_threads", &drain_autograd_device_threads,
        "Waits until autograd's threads for the SDK device have released every finished backward pass.");
}

}  // namespace torchbridge::python

// torchbridge._C fp8: the quantization and matmul behind torchbridge.fp8.Fp8Linear, so the Python
// layer computes with the same C++ code as torchbridge::amp::Fp8Linear. Python allocates every
// result and C++ writes into it (tensor_address.h says why).
#include <torchbridge/amp/fp8.h>

#include "tensor_address.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace torchbridge::python {

void bind_fp8(py::module_& m) {
  m.def(
      "_fp8_check_options",
      [](int64_t amax_history_length, int64_t margin, const std::string& kernel) {
        amp::DelayedScalingOptions{amax_history_length, margin}.validate();
        amp::parse_fp8_matmul_kernel(kernel);
      },
      py::arg("amax_history_length"), py::arg("margin"), py::arg("kernel"),
      "Raises ValueError naming a bad amax_history_length, margin or kernel name.");

  m.def(
      "_fp8_resolve_kernel",
      [](const std::string& kernel, const std::string& device) {
        return std::string(amp::to_string(amp::resolve_fp8_matmul_kernel(amp::parse_fp8_matmul_kernel(kernel),
                                                                          c10::Device(device))));
      },
      py::arg("kernel"), py::arg("device"), "What 'auto' (or a named kernel) means on a device: scaled_mm or emulated.");

  // Writes the quantized input into `data` and 1/scale into `scale_inverse`; updates the history
  // and scale in place (amp::quantize_delayed). The history's length is the option's.
  m.def(
      "_fp8_quantize",
      [](uintptr_t data, uintptr_t input, uintptr_t amax_history, uintptr_t scale, uintptr_t scale_inverse,
         const std::string& format, int64_t margin) {
        amp::Fp8ScalingState state{tensor_at(amax_history), tensor_at(scale)};
        const amp::DelayedScalingOptions options{state.amax_history.numel(), margin};
        tensor_at(scale_inverse)
            .copy_(amp::quantize_delayed_into(tensor_at(data), tensor_at(input), amp::parse_fp8_format(format),
                                              options, state));
      },
      py::arg("data"), py::arg("input"), py::arg("amax_history"), py::arg("scale"), py::arg("scale_inverse"),
      py::arg("format"), py::arg("margin"));

  // out = a @ b in out's dtype (amp::fp8_matmul_into: written in place where the kernel can).
  m.def(
      "_fp8_matmul",
      [](uintptr_t out, uintptr_t a, uintptr_t a_scale_inverse, uintptr_t b, uintptr_t b_scale_inverse,
         const std::string& kernel) {
        amp::fp8_matmul_into(tensor_at(out), tensor_at(a), tensor_at(a_scale_inverse), tensor_at(b),
                             tensor_at(b_scale_inverse), amp::parse_fp8_matmul_kernel(kernel));
      },
      py::arg("out"), py::arg("a"), py::arg("a_scale_inverse"), py::arg("b"), py::arg("b_scale_inverse"),
      py::arg("kernel"));
}

}  // namespace torchbridge::python

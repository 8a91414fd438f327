// torchbridge._C amp: the C++ GradScaler behind torchbridge.amp.GradScaler.
//
// Tensors arrive as TensorImpl addresses (tensor_address.h says why and when that is safe). The
// one result that is a new tensor, scale(outputs) = outputs * scale, must carry autograd history
// into Python, so Python computes that product from the scale tensor it shares with C++
// (python/torchbridge/amp.py).
#include <torchbridge/amp/grad_scaler.h>

#include "python_errors.h"
#include "tensor_address.h"

#include <ATen/core/Tensor.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchbridge::python {
namespace {

using amp::GradScaler;

GradScaler::Gradients gradients_at(const std::vector<uintptr_t>& addresses) {
  return [addresses] {
    std::vector<at::Tensor> tensors;
    tensors.reserve(addresses.size());
    for (const uintptr_t address : addresses) tensors.push_back(tensor_at(address));
    return tensors;
  };
}

const void* optimizer_key(uintptr_t optimizer_id) { return reinterpret_cast<const void*>(optimizer_id); }

using StateTuple = std::tuple<double, double, double, int64_t, int64_t>;

}  // namespace

void bind_amp(py::module_& m) {
  // torch raises AssertionError where GradScalerAssertion is thrown; the newest translator runs first.
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const amp::GradScalerAssertion& e) {
      set_python_error(PyExc_AssertionError, e.msg());
    }
  });

  py::class_<GradScaler>(m, "_GradScaler")
      .def(py::init([](double init_scale, double growth_factor, double backoff_factor, int64_t growth_interval,
                       bool enabled) {
             return GradScaler(amp::GradScalerOptions{init_scale, growth_factor, backoff_factor, growth_interval, enabled});
           }),
           py::arg("init_scale"), py::arg("growth_factor"), py::arg("backoff_factor"), py::arg("growth_interval"),
           py::arg("enabled"))
      .def("has_scale_tensor", &GradScaler::has_scale_tensor)
      .def("adopt_state_tensors", [](GradScaler& s, uintptr_t scale, uintptr_t tracker) {
        s.adopt_state_tensors(tensor_at(scale), tensor_at(tracker));
      })
      .def("unscale_", [](GradScaler& s, uintptr_t optimizer, const std::vector<uintptr_t>& gradients) {
        s.unscale_(optimizer_key(optimizer), gradients_at(gradients));
      })
      .def("prepare_step", [](GradScaler& s, uintptr_t optimizer, const std::vector<uintptr_t>& gradients) {
        return s.prepare_step(optimizer_key(optimizer), gradients_at(gradients));
      })
      .def("finish_step", [](GradScaler& s, uintptr_t optimizer) { s.finish_step(optimizer_key(optimizer)); })
      .def("update", [](GradScaler& s) { s.update(); })
      .def("update_to_float", [](GradScaler& s, double new_scale) { s.update(new_scale); })
      .def("update_to_tensor", [](GradScaler& s, uintptr_t new_scale) { s.update(tensor_at(new_scale)); })
      .def("get_scale", &GradScaler::get_scale)
      .def("get_growth_factor", &GradScaler::get_growth_factor)
      .def("set_growth_factor", &GradScaler::set_growth_factor)
      .def("get_backoff_factor", &GradScaler::get_backoff_factor)
      .def("set_backoff_factor", &GradScaler::set_backoff_factor)
      .def("get_growth_interval", &GradScaler::get_growth_interval)
      .def("set_growth_interval", &GradScaler::set_growth_interval)
      .def("growth_tracker", &GradScaler::growth_tracker)
      .def("is_enabled", &GradScaler::is_enabled)
      .def("step_in_progress", &GradScaler::step_in_progress)
      .def("state_dict",
           [](const GradScaler& s) -> std::optional<StateTuple> {
             const auto state = s.state_dict();
             if (!state) return std::nullopt;
             return StateTuple{state->scale, state->growth_factor, state->backoff_factor, state->growth_interval,
                               state->growth_tracker};
           })
      .def("load_state_dict", [](GradScaler& s, const std::optional<StateTuple>& state) {
        std::optional<amp::GradScalerState> loaded;
        if (state) {
          const auto& [scale, growth, backoff, interval, tracker] = *state;
          loaded = amp::GradScalerState{scale, growth, backoff, interval, tracker};
        }
        s.load_state_dict(loaded);
      });
}

}  // namespace torchbridge::python

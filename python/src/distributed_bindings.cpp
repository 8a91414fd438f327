// torchbridge._C's distributed part: the C++ process group and DataParallel for Python modules
// (python/torchbridge/distributed.py says when to use them rather than torch's own). Parameters
// and the loss cross as TensorImpl addresses (tensor_address.h), so the reducer's hooks sit on
// the very tensors Python trains.
#include "tensor_address.h"

#include <torchbridge/distributed/data_parallel.h>
#include <torchbridge/distributed/process_group.h>

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchbridge::python {

void bind_distributed(py::module_& m) {
  using distributed::DataParallel;
  using distributed::ProcessGroup;
  py::class_<ProcessGroup, std::shared_ptr<ProcessGroup>>(m, "_ProcessGroup")
      .def_static(
          "init",
          [](int64_t timeout_ms, const std::string& device) {
            distributed::InitOptions options;
            options.timeout = std::chrono::milliseconds(timeout_ms);
            options.device = device;
            return distributed::init(options);
          },
          py::arg("timeout_ms"), py::arg("device"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("world_size", &ProcessGroup::world_size)
      .def_property_readonly("local_rank", [](const ProcessGroup& group) { return group.environment().local_rank; })
      .def("barrier", &ProcessGroup::barrier, py::call_guard<py::gil_scoped_release>())
      .def("refuse_together", &ProcessGroup::refuse_together, py::arg("who"), py::arg("refusal"),
           py::call_guard<py::gil_scoped_release>());

  py::class_<DataParallel>(m, "_DataParallel")
      .def(py::init([](const std::vector<std::string>& names, const std::vector<uintptr_t>& parameters,
                       const std::vector<uintptr_t>& buffers, std::shared_ptr<ProcessGroup> group,
                       int64_t bucket_bytes, int64_t first_bucket_bytes, bool gradient_as_bucket_view,
                       bool broadcast_buffers, bool find_unused_parameters) {
             distributed::ModelTensors model;
             for (size_t i = 0; i < parameters.size(); ++i) model.parameters.emplace_back(names.at(i), tensor_at(parameters[i]));
             for (const uintptr_t buffer : buffers) model.buffers.push_back(tensor_at(buffer));
             distributed::DataParallelOptions options;
             options.bucket_bytes = bucket_bytes;
             options.first_bucket_bytes = first_bucket_bytes;
             options.gradient_as_bucket_view = gradient_as_bucket_view;
             options.broadcast_buffers = broadcast_buffers;
             options.find_unused_parameters = find_unused_parameters;
             const py::gil_scoped_release no_gil;  // collectives wait for the other ranks
             return std::make_unique<DataParallel>(model, std::move(group), options);
           }),
           py::arg("names"), py::arg("parameters"), py::arg("buffers"), py::arg("group"), py::arg("bucket_bytes"),
           py::arg("first_bucket_bytes"), py::arg("gradient_as_bucket_view"), py::arg("broadcast_buffers"),
           py::arg("find_unused_parameters"))
      // The GIL is released: the autograd engine takes it for Python nodes of the graph itself.
      .def(
          "backward", [](DataParallel& self, uintptr_t loss) { self.backward(tensor_at(loss)); }, py::arg("loss"),
          py::call_guard<py::gil_scoped_release>())
      .def("bucket_count", &DataParallel::bucket_count)
      .def("set_synchronize", &DataParallel::set_synchronize, py::arg("synchronize"))
      .def("synchronize", &DataParallel::synchronize);
}

}  // namespace torchbridge::python

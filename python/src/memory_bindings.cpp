// torchbridge._C memory: the C++ activation checkpointing (torchbridge::memory::CheckpointRegion)
// behind torchbridge.memory.checkpoint. Python runs the region's function; C++ records the region,
// replaces its graph and, during backward, calls back into Python to recompute it. Tensors cross by
// TensorImpl address (tensor_address.h): C++ attaches the backward node to detached tensors Python
// created, so nothing C++ makes has to become a Python object.
#include <torchbridge/memory/activation_checkpoint.h>
#include <torchbridge/memory/offloaded_optimizer.h>

#include "tensor_address.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchbridge::python {
namespace {

// Address 0 stands for "no tensor" (an output that carries no backward).
std::vector<at::Tensor> tensors_at(const std::vector<uintptr_t>& addresses) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(addresses.size());
  for (uintptr_t address : addresses) tensors.push_back(address == 0 ? at::Tensor() : tensor_at(address));
  return tensors;
}

// The Python recompute function, callable from autograd's threads. It returns (tensors, addresses):
// the tensors keep the addresses valid until C++ holds its own references. The Python object may be
// released on a thread without the GIL (when the graph is freed), so its deleter takes the GIL.
memory::CheckpointRegion::Recompute python_recompute(py::function function) {
  std::shared_ptr<py::function> held(new py::function(std::move(function)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [held]() {
    py::gil_scoped_acquire gil;
    std::vector<at::Tensor> outputs;
    std::string failure;
    try {
      const py::tuple result = (*held)();
      outputs = tensors_at(result[1].cast<std::vector<uintptr_t>>());
    } catch (py::error_already_set& error) {
      // Turned into a C++ error while the GIL is held, so the Python exception object is released
      // safely; autograd hands the message back to the caller of backward().
      failure = error.what();
    }
    TORCH_CHECK(failure.empty(), "torchbridge checkpoint: recomputing the region raised ", failure);
    return outputs;
  };
}

// The host optimizer torchbridge.memory.OffloadedAdam / OffloadedAdamW ask for: torch's C++ Adam or
// AdamW with the Python arguments.
memory::OffloadedOptimizer::Factory adam_factory(const std::string& kind, double lr, double beta1, double beta2,
                                                  double eps, double weight_decay, bool amsgrad) {
  TORCH_CHECK_VALUE(kind == "adam" || kind == "adamw", "OffloadedOptimizer: unknown optimizer '", kind,
                    "' (expected adam or adamw)");
  return [=](std::vector<at::Tensor> parameters) -> std::unique_ptr<torch::optim::Optimizer> {
    if (kind == "adam") {
      return std::make_unique<torch::optim::Adam>(
          parameters, torch::optim::AdamOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay)
                          .amsgrad(amsgrad));
    }
    return std::make_unique<torch::optim::AdamW>(
        parameters, torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay)
                        .amsgrad(amsgrad));
  };
}

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<memory::OffloadedOptimizer>(m, "_OffloadedOptimizer")
      .def(py::init([](const std::vector<uintptr_t>& parameters, const std::string& kind, double lr, double beta1,
                       double beta2, double eps, double weight_decay, bool amsgrad, int64_t bucket_bytes) {
             return std::make_unique<memory::OffloadedOptimizer>(
                 tensors_at(parameters), adam_factory(kind, lr, beta1, beta2, eps, weight_decay, amsgrad),
                 memory::OffloadOptions{bucket_bytes});
           }),
           py::arg("parameters"), py::arg("kind"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
           py::arg("weight_decay"), py::arg("amsgrad"), py::arg("bucket_bytes"))
      .def("step", &memory::OffloadedOptimizer::step, py::call_guard<py::gil_scoped_release>())
      .def("bucket_count", &memory::OffloadedOptimizer::bucket_count)
      .def("set_lr", [](memory::OffloadedOptimizer& self, double lr) {
        for (torch::optim::Optimizer* optimizer : self.host_optimizers()) {
          for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
        }
      });

  py::class_<memory::CheckpointRegion>(m, "_CheckpointRegion")
      .def(py::init([](const std::vector<uintptr_t>& inputs, bool preserve_rng_state, bool check_metadata) {
             return std::make_unique<memory::CheckpointRegion>(
                 tensors_at(inputs), memory::CheckpointOptions{preserve_rng_state, check_metadata});
           }),
           py::arg("inputs"), py::arg("preserve_rng_state"), py::arg("check_recomputed_metadata"),
           "Starts a region: records random and autocast state, the inputs' versions and the graph's position.")
      .def(
          "finish",
          [](memory::CheckpointRegion& region, const std::vector<uintptr_t>& outputs,
             const std::vector<uintptr_t>& attach_to, py::function recompute) {
            region.finish(tensors_at(outputs), tensors_at(attach_to), python_recompute(std::move(recompute)));
          },
          py::arg("outputs"), py::arg("attach_to"), py::arg("recompute"),
          "Replaces the region's graph by one recomputing node attached to `attach_to` (0: none).");
}

}  // namespace torchbridge::python

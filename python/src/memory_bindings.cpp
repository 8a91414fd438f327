// torchbridge._C memory: the C++ activation checkpointing (torchbridge::memory::CheckpointRegion)
// behind torchbridge.memory.checkpoint. Python runs the region's function; C++ records the region,
// replaces its graph and, during backward, calls back into Python to recompute it. Tensors cross by
// TensorImpl address (tensor_address.h): C++ attaches the backward node to detached tensors Python
// created, so nothing C++ makes has to become a Python object.
#include <torchbridge/memory/activation_checkpoint.h>
#include <torchbridge/memory/offloaded_optimizer.h>
#include <torchbridge/pinned_host.h>

#include "tensor_address.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <array>  // pybind11::make_tuple
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

// Parameter `index`'s Adam or AdamW state on the host (State: torch::optim::AdamParamState or
// AdamWParamState), or null before its first step.
template <typename State>
State* adam_state(const memory::OffloadedOptimizer& self, size_t index) {
  const auto [master, optimizer] = self.host_side_of(index);
  auto& states = optimizer->state();
  const auto found = states.find(master.unsafeGetTensorImpl());
  return found == states.end() ? nullptr : static_cast<State*>(found->second.get());
}

// (step, has max_exp_avg_sq), or None before the parameter's first step.
template <typename State>
py::object state_summary(const memory::OffloadedOptimizer& self, size_t index) {
  const State* state = adam_state<State>(self, index);
  if (state == nullptr) return py::none();
  return py::make_tuple(state->step(), state->max_exp_avg_sq().defined());
}

// Copies the state into CPU tensors Python made (address 0: max_exp_avg_sq not wanted).
template <typename State>
void copy_state_into(const memory::OffloadedOptimizer& self, size_t index, uintptr_t exp_avg, uintptr_t exp_avg_sq,
                     uintptr_t max_exp_avg_sq) {
  const State* state = adam_state<State>(self, index);
  TORCH_CHECK_VALUE(state != nullptr, "OffloadedOptimizer: parameter ", index, " has no state yet");
  tensor_at(exp_avg).copy_(state->exp_avg());
  tensor_at(exp_avg_sq).copy_(state->exp_avg_sq());
  if (max_exp_avg_sq != 0) tensor_at(max_exp_avg_sq).copy_(state->max_exp_avg_sq());
}

// Replaces the state with copies of tensors Python checked (shape) and made CPU float32.
template <typename State>
void load_state(const memory::OffloadedOptimizer& self, size_t index, int64_t step, uintptr_t exp_avg,
                uintptr_t exp_avg_sq, uintptr_t max_exp_avg_sq) {
  const auto [master, optimizer] = self.host_side_of(index);
  auto state = std::make_unique<State>();
  state->step(step);
  state->exp_avg(tensor_at(exp_avg).to(master.options(), /*non_blocking=*/false, /*copy=*/true));
  state->exp_avg_sq(tensor_at(exp_avg_sq).to(master.options(), /*non_blocking=*/false, /*copy=*/true));
  if (max_exp_avg_sq != 0) {
    state->max_exp_avg_sq(tensor_at(max_exp_avg_sq).to(master.options(), /*non_blocking=*/false, /*copy=*/true));
  }
  optimizer->state()[master.unsafeGetTensorImpl()] = std::move(state);
}

template <typename Options>
void set_options(const memory::OffloadedOptimizer& self, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool amsgrad) {
  for (torch::optim::Optimizer* optimizer : self.host_optimizers()) {
    for (auto& group : optimizer->param_groups()) {
      auto& options = static_cast<Options&>(group.options());
      options.lr(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay).amsgrad(amsgrad);
    }
  }
}

// The state and options types of torch's Adam and of its AdamW, which OffloadedAdam and
// OffloadedAdamW step the host copies with.
struct AdamTypes {
  using State = torch::optim::AdamParamState;
  using Options = torch::optim::AdamOptions;
};
struct AdamWTypes {
  using State = torch::optim::AdamWParamState;
  using Options = torch::optim::AdamWOptions;
};

// Calls `visit` with AdamTypes or AdamWTypes, as the host optimizer itself is (adam_factory made it):
// the state and options are cast to those types, so the kind is read from the optimizer, not passed.
template <typename Visit>
decltype(auto) with_adam_types(const memory::OffloadedOptimizer& self, Visit&& visit) {
  // Every bucket's optimizer came from the same factory; parameter 0 exists (construction refuses none).
  const torch::optim::Optimizer* optimizer = self.host_side_of(0).second;
  if (dynamic_cast<const torch::optim::AdamW*>(optimizer) != nullptr) return visit(AdamWTypes{});
  TORCH_CHECK(dynamic_cast<const torch::optim::Adam*>(optimizer) != nullptr,
              "OffloadedOptimizer: the host optimizer is neither torch's Adam nor its AdamW");
  return visit(AdamTypes{});
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
      })
      // The Adam/AdamW state, for state_dict and load_state_dict.
      .def("state_summary", [](const memory::OffloadedOptimizer& self, size_t index) {
        return with_adam_types(self, [&](auto types) {
          return state_summary<typename decltype(types)::State>(self, index);
        });
      })
      .def("copy_state_into", [](const memory::OffloadedOptimizer& self, size_t index, uintptr_t exp_avg,
                                 uintptr_t exp_avg_sq, uintptr_t max_exp_avg_sq) {
        with_adam_types(self, [&](auto types) {
          copy_state_into<typename decltype(types)::State>(self, index, exp_avg, exp_avg_sq, max_exp_avg_sq);
        });
      })
      .def("load_state", [](const memory::OffloadedOptimizer& self, size_t index, int64_t step, uintptr_t exp_avg,
                            uintptr_t exp_avg_sq, uintptr_t max_exp_avg_sq) {
        with_adam_types(self, [&](auto types) {
          load_state<typename decltype(types)::State>(self, index, step, exp_avg, exp_avg_sq, max_exp_avg_sq);
        });
      })
      .def("clear_state", [](const memory::OffloadedOptimizer& self, size_t index) {
        const auto [master, optimizer] = self.host_side_of(index);
        optimizer->state().erase(master.unsafeGetTensorImpl());
      })
      .def("set_options", [](const memory::OffloadedOptimizer& self, double lr, double beta1, double beta2,
                             double eps, double weight_decay, bool amsgrad) {
        with_adam_types(self, [&](auto types) {
          set_options<typename decltype(types)::Options>(self, lr, beta1, beta2, eps, weight_decay, amsgrad);
        });
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

  m.def(
      "_pin_host_like",
      [](uintptr_t host, uintptr_t like) {
        const at::Tensor source = tensor_at(like);
        at::Tensor target = tensor_at(host);
        TORCH_CHECK_VALUE(target.is_cpu() && target.scalar_type() == source.scalar_type(),
                          "_pin_host_like: the host tensor must be a CPU tensor of the source's dtype");
        target.set_(pinned_host_like(source, source.device().type()));
      },
      py::arg("host"), py::arg("like"),
      "Puts into `host` (a CPU tensor) uninitialised memory shaped as `like`, pinned by the pinned allocator of "
      "`like`'s device type (torch's pin_memory=True pins for CUDA whenever CUDA is present).");
}

}  // namespace torchbridge::python

// torchbridge._C: the Python face of libtorchbridge. Descriptions cross as the same JSON the CLI
// prints (to_json_text, src/core/json_text.cpp), so there is one encoding of DeviceInfo and MemoryStats.
#include "child_process.h"
#include "commands.h"
#include "compiler_runtime.h"
#include "python_errors.h"

#include <torchbridge/process_isolation.h>
#include <torchbridge/one_accelerator.h>
#include <torchbridge/redirect.h>
#include <torchbridge/json_text.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>
#include <torchbridge/version.h>

#include <ATen/core/Generator.h>
#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <signal.h>

#include <array>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;
using namespace torchbridge;

namespace {

// Collects c10 warnings (TORCH_WARN) raised on this thread while installed.
class CollectedWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

// c10 errors become the Python exceptions torch itself raises, without the C++ backtrace.
void register_exceptions() {
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const c10::OutOfMemoryError& e) {
      python::set_python_error(py::module_::import("torch").attr("OutOfMemoryError").ptr(), e.msg());
    } catch (const c10::IndexError& e) {
      python::set_python_error(PyExc_IndexError, e.msg());
    } catch (const c10::ValueError& e) {
      python::set_python_error(PyExc_ValueError, e.msg());
    } catch (const c10::NotImplementedError& e) {
      python::set_python_error(PyExc_NotImplementedError, e.msg());
    } catch (const c10::Error& e) {
      python::set_python_error(PyExc_RuntimeError, e.msg());
    }
  });
}

at::Generator device_generator(const std::string& device_type, int index) {
  return at::globalContext().defaultGenerator(c10::Device(device_type + ":" + std::to_string(index)));
}

}  // namespace

namespace torchbridge::python {
void bind_checkpoint(py::module_& m);  // checkpoint_bindings.cpp
void bind_validation(py::module_& m);  // validation_bindings.cpp
void bind_autograd_exit(py::module_& m);  // autograd_exit.cpp
void bind_optimize(py::module_& m);  // optimize_bindings.cpp
void bind_amp(py::module_& m);  // amp_bindings.cpp
void bind_fp8(py::module_& m);  // fp8_bindings.cpp
void bind_memory(py::module_& m);  // memory_bindings.cpp
void bind_recomputation(py::module_& m);  // recomputation_bindings.cpp
void bind_distributed(py::module_& m);  // distributed_bindings.cpp
}

namespace {

// SIGINT's default action (ending the process) while it lives, the previous handler afterwards.
class DefaultSigint {
 public:
  DefaultSigint() {
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~DefaultSigint() { sigaction(SIGINT, &previous_, nullptr); }
  DefaultSigint(const DefaultSigint&) = delete;
  DefaultSigint& operator=(const DefaultSigint&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchBridge C++ core";
  m.attr("__version__") = library_version();
  register_exceptions();

  py::class_<Backend, std::shared_ptr<Backend>>(m, "Backend")
      .def_property_readonly("name", &Backend::name)
      .def_property_readonly("device_type",
                             [](const Backend& b) { return c10::DeviceTypeName(b.device_type(), true); })
      .def("availability",
           [](const Backend& b) {
             const Availability a = b.availability();
             return py::make_tuple(to_string(a.status), a.reason);
           })
      .def("is_available", &Backend::is_available)
      .def("is_real_hardware", &Backend::is_real_hardware)
      .def("device_count", &Backend::device_count)
      // (type, index) of torch's device; index None for the CPU, which torch names without one.
      .def("device",
           [](const Backend& b, int index) {
             const c10::Device d = b.device(index);
             return py::make_tuple(c10::DeviceTypeName(d.type(), true),
                                   d.has_index() ? py::cast(int(d.index())) : py::none());
           },
           py::arg("index") = 0)
      .def("info_json", [](const Backend& b, int index) { return to_json_text(b.info(index)); },
           py::arg("index") = 0)
      .def("memory_stats_json", [](const Backend& b, int index) { return to_json_text(b.memory_stats(index)); },
           py::arg("index") = 0)
      .def("reset_peak_memory_stats", &Backend::reset_peak_memory_stats, py::arg("index") = 0)
      .def("empty_cache", &Backend::empty_cache)
      .def("synchronize", &Backend::synchronize, py::arg("index") = 0, py::call_guard<py::gil_scoped_release>());

  m.def("lookup", [](const std::string& name) { return BackendRegistry::instance().lookup(name); });
  m.def("create", [](const std::string& name) { return BackendRegistry::instance().create(name); });
  m.def("detect_best_backend", [] { return BackendRegistry::instance().detect_best_backend(); });
  m.def("valid_names", [] { return BackendRegistry::instance().valid_names(); });
  m.def("backend_names", [] {
    std::vector<std::string> names;
    for (const auto& entry : BackendRegistry::instance().entries()) names.push_back(entry.name);
    return names;
  });
  // The canonical name of a level ("o2" -> "O2"); ValueError naming an unknown one.
  m.def("parse_opt_level", [](const std::string& level) { return to_string(parse_opt_level(level)); });

  m.def("resolve_device", [](const std::string& requested, const std::string& target, bool explicit_target) {
    const DeviceResolution r = resolve_device(requested, target,
                                              explicit_target ? RedirectTarget::kExplicit : RedirectTarget::kDetected);
    return py::make_tuple(c10::DeviceTypeName(r.device.type(), true),
                          r.device.has_index() ? py::cast(int(r.device.index())) : py::none(), r.redirected,
                          r.index_wrapped);
  });
  // A warning the load raises (a device loaded after the process's first backward pass) becomes a
  // Python RuntimeWarning; c10 would otherwise print it to stderr.
  m.def(
      "load_device",
      [](const std::string& name) {
        CollectedWarnings collected;
        {
          const c10::WarningUtils::WarningHandlerGuard guard(&collected);
          sdk::load_device(name);
        }
        for (const auto& message : collected.messages) {
          if (python::warn_in_python(PyExc_RuntimeWarning, message, 2) != 0) throw py::error_already_set();
        }
      },
      py::arg("name"));
  m.def("sdk_autograd_refusal", [] { return sdk::autograd_refusal(); });
  m.def("check_backends_can_share_a_process", &check_backends_can_share_a_process, py::arg("backends"),
        py::arg("what"));
  // Device selection of the PrivateUse1 device, answered by its registered guard (torch's own
  // torch.accelerator delegates to the device module, which is answered from here).
  m.def("privateuse1_current_device", [] {
    return int(c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index());
  });
  m.def("privateuse1_set_device", [](int index) {
    const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
    TORCH_CHECK_INDEX(index >= 0 && index < guard->deviceCount(), "device index ", index, " is out of range (",
                      int(guard->deviceCount()), " devices)");
    guard->setDevice(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
  });
  m.def("registered_device", &sdk::registered_device);
  m.def("in_bad_fork", &sdk::in_bad_fork);
  m.def("available_devices", &sdk::available_devices);
  m.def("sdk_stream_priority", [](int device_index, int64_t stream_id, int device_type) {
    return sdk::stream_priority(c10::Stream(c10::Stream::UNSAFE,
                                            c10::Device(static_cast<c10::DeviceType>(device_type),
                                                        static_cast<c10::DeviceIndex>(device_index)),
                                            static_cast<c10::StreamId>(stream_id)));
  }, py::arg("device_index"), py::arg("stream_id"), py::arg("device_type"));
  m.def("sdk_set_memory_fraction", &sdk::set_memory_fraction, py::arg("fraction"), py::arg("index"));
  m.def("sdk_memory_fraction", &sdk::memory_fraction, py::arg("index"));
  m.def("fallback_counts", &sdk::fallback_counts);
  m.def("reset_fallback_counts", &sdk::reset_fallback_counts);

  // Default generators of accelerator devices (state crosses as bytes).
  m.def("generator_manual_seed", [](const std::string& type, int index, uint64_t seed) {
    at::Generator g = device_generator(type, index);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  });
  m.def("generator_seed", [](const std::string& type, int index) {
    at::Generator g = device_generator(type, index);
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.seed();
  });
  m.def("generator_initial_seed", [](const std::string& type, int index) {
    return device_generator(type, index).current_seed();
  });
  m.def("generator_get_state", [](const std::string& type, int index) {
    at::Generator g = device_generator(type, index);
    std::lock_guard<std::mutex> lock(g.mutex());
    const at::Tensor state = g.get_state();
    return py::bytes(static_cast<const char*>(state.data_ptr()), state.numel());
  });
  m.def("generator_set_state", [](const std::string& type, int index, const std::string& state) {
    at::Generator g = device_generator(type, index);
    at::Tensor tensor = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(tensor.data_ptr(), state.data(), state.size());
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(tensor);
  });

  torchbridge::python::bind_checkpoint(m);
  torchbridge::python::bind_validation(m);
  torchbridge::python::bind_autograd_exit(m);
  torchbridge::python::bind_optimize(m);
  torchbridge::python::bind_amp(m);
  torchbridge::python::bind_fp8(m);
  torchbridge::python::bind_memory(m);
  torchbridge::python::bind_recomputation(m);
  torchbridge::python::bind_distributed(m);

  // `self_command` starts the tool again for work that runs in a child process (an SDK device
  // beside CUDA in `validate`/`portability`); from Python that is the interpreter, not this process's binary.
  m.def(
      "run_cli",
      [](const std::vector<std::string>& argv, const std::vector<std::string>& self_command) {
        cli::set_self_invocation(self_command);
        // Python's SIGINT handler only sets a flag, read when the command returns: Ctrl-C let a
        // 5,000-step `train` run to its end and print its result. The command dies of SIGINT as
        // the C++ binary does; Python's handler is back afterwards.
        const DefaultSigint default_sigint;
        py::gil_scoped_release release;
        return cli::run_cli(argv);
      },
      py::arg("argv"), py::arg("self_command"));

  // doctor's probe, asked again by deployment/_cxx_runtime.py before AOTInductor compiles: one
  // answer to "does this compiler copy libstdc++ into shared libraries" for both.
  m.def(
      "_probe_compiler_runtime",
      [](const std::string& compiler) {
        cli::CompilerRuntime probe;
        {
          py::gil_scoped_release release;  // it runs the compiler and readelf
          probe = cli::probe_compiler_runtime(compiler);
        }
        return std::make_pair(std::string(cli::kind_name(probe.kind)), probe.detail);
      },
      py::arg("compiler"));
}

// torchbridge._C validation: the C++ Validator driving Python models. A Python model is placed
// and run by Python callbacks (python/torchbridge/validation.py); only CPU tensors cross, as
// DLPack capsules, so every check and tolerance stays in C++ (one implementation for all kinds).
#include "dlpack_bridge.h"

#include <torchbridge/device_info.h>
#include <torchbridge/precision.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/validation/validator.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchbridge::python {
namespace {

py::list capsules(const std::vector<at::Tensor>& tensors) {
  py::list out;
  for (const auto& t : tensors) out.append(to_capsule(t.contiguous()));
  return out;
}

// A placed copy held by Python: an object with run(inputs, weights_for) -> (outputs,
// [(name, grad)]) and save_and_reload() -> another such object.
class PythonPlacedModel final : public validation::PlacedModel {
 public:
  explicit PythonPlacedModel(py::object handle) : handle_(std::move(handle)) {}
  ~PythonPlacedModel() override {
    py::gil_scoped_acquire gil;
    handle_ = py::object();  // drops the Python copy (and its device memory) now
  }

  validation::RunResult run(const std::vector<at::Tensor>& inputs, const validation::OutputWeights& weights) override {
    py::gil_scoped_acquire gil;
    // Python gets the weights as a callable from output shapes to capsules (None: forward only).
    py::object weights_for = py::none();
    if (weights) {
      weights_for = py::cpp_function(
          [weights](const std::vector<std::vector<int64_t>>& shapes) { return capsules(weights(shapes)); });
    }
    const py::tuple result = handle_.attr("run")(capsules(inputs), weights_for);
    validation::RunResult out;
    for (const auto& capsule : result[0].cast<py::list>()) out.outputs.push_back(from_capsule(capsule.cast<py::capsule>()));
    for (const auto& item : result[1].cast<py::list>()) {
      const auto pair = item.cast<py::tuple>();
      out.gradients.emplace_back(pair[0].cast<std::string>(), from_capsule(pair[1].cast<py::capsule>()));
    }
    return out;
  }

  std::unique_ptr<validation::PlacedModel> save_and_reload() const override {
    py::gil_scoped_acquire gil;
    return std::make_unique<PythonPlacedModel>(handle_.attr("save_and_reload")());
  }

 private:
  py::object handle_;
};

class PythonModelSource final : public validation::ModelSource {
 public:
  PythonModelSource(py::object place, std::string kind) : place_(std::move(place)), kind_(std::move(kind)) {}
  std::string kind() const override { return kind_; }
  std::unique_ptr<validation::PlacedModel> place(c10::Device device, c10::ScalarType dtype,
                                                 std::optional<c10::ScalarType> round_through) const override {
    py::gil_scoped_acquire gil;
    const py::object rounding = round_through ? py::object(py::str(dtype_name(*round_through))) : py::none();
    return std::make_unique<PythonPlacedModel>(place_(device.str(), dtype_name(dtype), rounding));
  }

 private:
  py::object place_;  // place(device: str, dtype: str, round_through: str | None) -> placed copy
  std::string kind_;
};

}  // namespace

void bind_validation(py::module_& m) {
  // Returns the report as JSON (the schema `torchbridge validate --json` prints).
  m.def("validate_python_model",
        [](py::object place, const std::string& kind, const std::vector<py::capsule>& inputs,
           const std::vector<std::string>& backends, const std::string& precision, uint64_t seed,
           py::object progress) {
          validation::ValidatorOptions options;
          options.backends = backends;
          options.precision = validation::validation_precision(precision);
          options.seed = seed;
          if (!progress.is_none()) {
            options.progress = [progress](const std::string& backend, const std::string& step, int done, int total) {
              py::gil_scoped_acquire gil;
              progress(backend, step, done, total);
            };
          }
          const validation::Validator validator(options);
          std::vector<at::Tensor> tensors;
          for (const auto& capsule : inputs) tensors.push_back(from_capsule(capsule));
          const PythonModelSource source(std::move(place), kind);
          validation::ValidationReport report;
          {
            // The validator computes its reference on a thread of its own, which places and runs a
            // copy through the Python callbacks: they take the GIL when they need it, so it must
            // not be held here while the validator waits for that thread.
            const py::gil_scoped_release release;
            report = validator.validate(source, tensors);
          }
          return validation::report_json(report);
        });
  // One CPU result against its CPU reference under a precision's output bound: metrics and verdict.
  m.def("check_output", [](const py::capsule& result, const py::capsule& reference, const std::string& precision) {
    const validation::OutputCheck check =
        validation::check_output(from_capsule(result), from_capsule(reference), parse_precision(precision));
    return py::dict(py::arg("max_abs_error") = check.metrics.max_abs_error,
                    py::arg("max_rel_error") = check.metrics.max_rel_error,
                    py::arg("rel_l2_error") = check.metrics.rel_l2_error,
                    py::arg("cosine_similarity") = check.metrics.cosine_similarity, py::arg("within") = check.within);
  }, py::arg("result"), py::arg("reference"), py::arg("precision"));
  m.def("parse_shape", &validation::parse_shape);
  m.def("builtin_model_names", [] {
    std::vector<std::string> names;
    for (const auto& model : validation::builtin_models()) names.push_back(model.name);
    return names;
  });
  m.def("builtin_model_input_shape",
        [](const std::string& name) { return validation::builtin_model_info(name).input_shape; });
  // Built-in models are TorchScript built in C++; Python gets them through a TorchScript file.
  m.def("save_builtin_model", [](const std::string& name, const std::string& path, uint64_t seed) {
    validation::make_builtin_model(name, seed).save(path);
  });
}

}  // namespace torchbridge::python

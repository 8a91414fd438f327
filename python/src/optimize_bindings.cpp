// The configuration, the precision policy and the optimization plan for the Python package. The
// Python TorchBridgeConfig crosses as the same JSON document the C++ reader validates, and the
// plan comes back as JSON for the Python executor (python/torchbridge/optimize.py).
#include <torchbridge/json_text.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/optimize/manager.h>
#include <torchbridge/optimize/plan.h>
#include <torchbridge/precision_policy.h>
#include <torchbridge/registry.h>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace torchbridge::python {
namespace {

TorchBridgeConfig preset(const std::string& name) {
  if (name == "training") return TorchBridgeConfig::for_training();
  if (name == "inference") return TorchBridgeConfig::for_inference();
  if (name == "development") return TorchBridgeConfig::for_development();
  if (name == "default") return TorchBridgeConfig{};
  TORCH_CHECK_VALUE(false, "unknown preset '", name, "'; expected training, inference, development or default");
}

ModelTraits traits_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  ModelTraits traits;
  traits.python = true;
  traits.torchscript = j.at("torchscript").get<bool>();
  traits.has_convolutions = j.at("has_convolutions").get<bool>();
  traits.has_linear = j.at("has_linear").get<bool>();
  traits.has_int8_linear = j.at("has_int8_linear").get<bool>();
  traits.optimizer = j.at("optimizer").get<std::string>();
  traits.has_example_inputs = j.at("has_example_inputs").get<bool>();
  traits.has_block_container = j.at("has_block_container").get<bool>();
  return traits;
}

std::string plan_json(const UnifiedManager& manager, const std::string& traits) {
  nlohmann::json steps = nlohmann::json::array();
  for (const PlannedStep& step : manager.plan(traits_from_json(traits))) {
    steps.push_back({{"name", step.name},
                     {"level", to_string(step.level)},
                     {"apply", step.apply},
                     {"reason", step.reason},
                     {"argument", step.argument}});
  }
  return steps.dump();
}

std::string precision_json(const std::string& backend, int index, const std::string& requested) {
  const DeviceInfo info = BackendRegistry::instance().create(backend)->info(index);
  return to_json_text(decide_precision(info, requested), precision_capabilities(info));
}

}  // namespace

void bind_optimize(py::module_& m) {
  m.def("config_schema", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> rows;
    for (const auto& f : config_schema()) rows.emplace_back(f.name, f.type, f.environment, f.description);
    return rows;
  });
  m.def("config_preset", [](const std::string& name) { return to_json_text(preset(name)); }, py::arg("name"));
  // Validates a whole document (every key present or not) and returns it normalised.
  m.def("config_check", [](const std::string& json, const std::string& source) {
    return to_json_text(config_from_json_text(json, TorchBridgeConfig{}, source));
  }, py::arg("json"), py::arg("source") = "configuration");
  m.def("config_load", [](const std::string& path, const std::string& base) {
    return to_json_text(load_config(path, config_from_json_text(base)));
  }, py::arg("path"), py::arg("base"));
  m.def("config_with_environment", [](const std::string& json) {
    return to_json_text(with_environment(config_from_json_text(json)));
  }, py::arg("json"));
  m.def("decide_precision", &precision_json, py::arg("backend"), py::arg("index"), py::arg("requested"));

  py::class_<UnifiedManager>(m, "UnifiedManager")
      .def(py::init([](const std::string& json) { return UnifiedManager(config_from_json_text(json)); }),
           py::arg("config_json"))
      .def_property_readonly("backend_name", [](const UnifiedManager& self) { return self.backend().name(); })
      .def_property_readonly("device", [](const UnifiedManager& self) { return self.device().str(); })
      .def("precision_json", [](const UnifiedManager& self) {
        return to_json_text(self.precision(), precision_capabilities(self.backend().info(self.config().device_index)));
      })
      .def("plan_json", &plan_json, py::arg("traits_json"));
}

}  // namespace torchbridge::python

#include <torchbridge/optimize/config.h>

#include "optimize/flat_toml.h"

#include <torchbridge/parse_integer.h>
#include <torchbridge/precision.h>
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

// What a field's value may be, and how to store it into a config: one row per field, so the
// schema, reading, writing and the environment cannot disagree.
struct FieldCodec {
  ConfigField field;
  std::function<void(TorchBridgeConfig&, const nlohmann::json&, const std::string& where)> read;
  std::function<nlohmann::json(const TorchBridgeConfig&)> write;
  // Text from an environment variable as the JSON value it stands for.
  std::function<nlohmann::json(const std::string& text, const std::string& where)> from_text;
};

[[noreturn]] void wrong_type(const std::string& where, const char* expected, const nlohmann::json& value) {
  TORCH_CHECK_VALUE(false, where, ": expected ", expected, ", got ", value.dump());
}

std::string read_string(const nlohmann::json& value, const std::string& where) {
  if (!value.is_string()) wrong_type(where, "a string", value);
  return value.get<std::string>();
}

nlohmann::json text_as_is(const std::string& text, const std::string&) { return text; }

nlohmann::json text_as_boolean(const std::string& text, const std::string& where) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  TORCH_CHECK_VALUE(false, where, ": expected 1/0, true/false, yes/no or on/off, got '", text, "'");
}

FieldCodec boolean_field(ConfigField field, bool TorchBridgeConfig::*member) {
  return {field,
          [member](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
            if (!v.is_boolean()) wrong_type(where, "true or false", v);
            c.*member = v.get<bool>();
          },
          [member](const TorchBridgeConfig& c) { return nlohmann::json(c.*member); }, text_as_boolean};
}

const std::vector<FieldCodec>& codecs() {
  static const std::vector<FieldCodec> rows = {
      {{"backend", "string", "TORCHBRIDGE_BACKEND",
        "backend name or alias (cuda, nvidia, rocm, cpu, emu, ...), or \"auto\" for the best one here"},
       [](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) { c.backend = read_string(v, where); },
       [](const TorchBridgeConfig& c) { return nlohmann::json(c.backend); }, text_as_is},
      {{"device_index", "integer", "TORCHBRIDGE_DEVICE_INDEX", "which device of the backend (0-based)"},
       [](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
         if (!v.is_number_integer()) wrong_type(where, "an integer", v);
         const int64_t index = v.get<int64_t>();
         TORCH_CHECK_VALUE(index >= 0 && index <= 1 << 20, where, ": expected a device index >= 0, got ", index);
         c.device_index = static_cast<int>(index);
       },
       [](const TorchBridgeConfig& c) { return nlohmann::json(c.device_index); },
       [](const std::string& text, const std::string& where) {
         return nlohmann::json(parse_integer(text, where, 0, 1 << 20));
       }},
      {{"precision", "string", "TORCHBRIDGE_PRECISION",
        "\"auto\" (the fastest precision the hardware accelerates) or fp64, fp32, tf32, bf16, fp16, fp8"},
       [](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) { c.precision = read_string(v, where); },
       [](const TorchBridgeConfig& c) { return nlohmann::json(c.precision); }, text_as_is},
      {{"optimization_level", "level", "TORCHBRIDGE_OPTIMIZATION_LEVEL",
        "O0 place only, O1 precision-neutral rewrites, O2 + mixed precision and compilation, O3 + FP8 and "
        "inference transforms"},
       [](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
         const std::string text = read_string(v, where);
         try {
           c.optimization_level = parse_opt_level(text);
         } catch (const c10::Error& e) {
           TORCH_CHECK_VALUE(false, where, ": ", e.msg());
         }
       },
       [](const TorchBridgeConfig& c) { return nlohmann::json(to_string(c.optimization_level)); }, text_as_is},
      boolean_field({"training", "boolean", "TORCHBRIDGE_TRAINING",
                     "true keeps fp32 master weights under autocast; false allows casting and quantizing weights"},
                    &TorchBridgeConfig::training),
      boolean_field({"compile", "boolean", "TORCHBRIDGE_COMPILE",
                     "O2 and up compile the model where the front end can (Python: torch.compile)"},
                    &TorchBridgeConfig::compile),
      boolean_field({"deterministic", "boolean", "TORCHBRIDGE_DETERMINISTIC",
                     "deterministic algorithms only, and no timing-based kernel selection"},
                    &TorchBridgeConfig::deterministic),
      boolean_field({"validation", "boolean", "TORCHBRIDGE_VALIDATION",
                     "optimize() with example inputs checks the optimized outputs against the original model in "
                     "float64 on the CPU"},
                    &TorchBridgeConfig::validation),
  };
  return rows;
}

std::string valid_keys() {
  std::string keys;
  for (const auto& codec : codecs()) keys += (keys.empty() ? "" : ", ") + std::string(codec.field.name);
  return keys;
}

TorchBridgeConfig from_json(const nlohmann::json& document, TorchBridgeConfig config, std::string_view source) {
  TORCH_CHECK_VALUE(document.is_object(), source, ": expected a JSON object of configuration fields, got ",
                    document.type_name());
  for (const auto& item : document.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    const auto codec = std::find_if(codecs().begin(), codecs().end(),
                                    [&](const FieldCodec& c) { return key == c.field.name; });
    TORCH_CHECK_VALUE(codec != codecs().end(), source, ": unknown key '", key, "'; the configuration has ",
                      valid_keys());
    codec->read(config, value, std::string(source) + ": '" + key + "'");
  }
  validate(config);
  return config;
}

}  // namespace

TorchBridgeConfig TorchBridgeConfig::for_training() { return {}; }

TorchBridgeConfig TorchBridgeConfig::for_inference() {
  TorchBridgeConfig config;
  config.optimization_level = OptLevel::O3;
  config.training = false;
  return config;
}

TorchBridgeConfig TorchBridgeConfig::for_development() {
  TorchBridgeConfig config;
  config.precision = "fp32";
  config.optimization_level = OptLevel::O0;
  config.compile = false;
  config.deterministic = true;
  config.validation = true;
  return config;
}

const std::vector<ConfigField>& config_schema() {
  static const std::vector<ConfigField> schema = [] {
    std::vector<ConfigField> fields;
    for (const auto& codec : codecs()) fields.push_back(codec.field);
    return fields;
  }();
  return schema;
}

void validate(const TorchBridgeConfig& config) {
  TORCH_CHECK_VALUE(!config.backend.empty(), "backend: expected a backend name or \"auto\", got an empty name");
  if (config.backend != "auto") {
    // device_type_of answers for every known name without creating or loading anything.
    try {
      BackendRegistry::instance().device_type_of(config.backend);
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, "backend: ", e.msg());
    }
  }
  TORCH_CHECK_VALUE(config.device_index >= 0, "device_index: expected >= 0, got ", config.device_index);
  if (config.precision != "auto") {
    try {
      parse_precision(config.precision);
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, "precision: ", e.msg(), ", or \"auto\"");
    }
  }
}

TorchBridgeConfig config_from_json_text(std::string_view json, const TorchBridgeConfig& base, std::string_view source) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(json);
  } catch (const nlohmann::json::parse_error& e) {
    TORCH_CHECK_VALUE(false, source, ": not valid JSON (", e.what(), ")");
  }
  return from_json(document, base, source);
}

std::string to_json_text(const TorchBridgeConfig& config, int indent) {
  nlohmann::json document = nlohmann::json::object();
  for (const auto& codec : codecs()) document[codec.field.name] = codec.write(config);
  return document.dump(indent);
}

TorchBridgeConfig load_config(const std::string& path, const TorchBridgeConfig& base) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK_VALUE(file, "cannot read the configuration file '", path, "'");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".json")) return config_from_json_text(text, base, path);
  if (ends_with(".toml")) return from_json(optimize_detail::parse_flat_toml(text, path), base, path);
  TORCH_CHECK_VALUE(false, "configuration file '", path, "': expected a .json or .toml file");
}

TorchBridgeConfig with_environment(TorchBridgeConfig config, const std::function<const char*(const char*)>& getenv) {
  const auto lookup = getenv ? getenv : [](const char* name) -> const char* { return std::getenv(name); };
  nlohmann::json overrides = nlohmann::json::object();
  for (const auto& codec : codecs()) {
    const char* value = lookup(codec.field.environment);
    if (value == nullptr || *value == '\0') continue;  // empty counts as unset, as for TORCHBRIDGE_BACKEND
    overrides[codec.field.name] = codec.from_text(value, codec.field.environment);
  }
  return from_json(overrides, std::move(config), "environment");
}

}  // namespace torchbridge

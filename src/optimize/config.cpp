#include <torchbridge/optimize/config.h>

#include "core/strict_json.h"
#include "core/to_lower.h"
#include "optimize/flat_toml.h"

#include <torchbridge/closest_name.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/precision.h>
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <cstddef>
#include <exception>
#include <vector>

namespace torchbridge {
namespace {

// Far deeper than any section; bounds the parser on a hostile file.
constexpr int kMaxConfigDepth = 64;

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

// In any case (True, ON), as environment variables are commonly written.
nlohmann::json text_as_boolean(const std::string& text, const std::string& where) {
  const std::string word = detail::to_lower(text);
  if (word == "1" || word == "true" || word == "yes" || word == "on") return true;
  if (word == "0" || word == "false" || word == "no" || word == "off") return false;
  TORCH_CHECK_VALUE(false, where, ": expected 1/0, true/false, yes/no or on/off (any case), got '", text, "'");
}

// Where a field lives in the config; the same accessor serves reading and writing.
template <typename T>
using FieldOf = T& (*)(TorchBridgeConfig&);

template <typename T>
const T& field_value(FieldOf<T> member, const TorchBridgeConfig& config) {
  return member(const_cast<TorchBridgeConfig&>(config));  // only read
}

FieldCodec boolean_field(ConfigField field, FieldOf<bool> member) {
  return {field,
          [member](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
            if (!v.is_boolean()) wrong_type(where, "true or false", v);
            member(c) = v.get<bool>();
          },
          [member](const TorchBridgeConfig& c) { return nlohmann::json(field_value(member, c)); }, text_as_boolean};
}

FieldCodec string_field(ConfigField field, FieldOf<std::string> member) {
  return {field,
          [member](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
            member(c) = read_string(v, where);
          },
          [member](const TorchBridgeConfig& c) { return nlohmann::json(field_value(member, c)); }, text_as_is};
}

FieldCodec number_field(ConfigField field, FieldOf<double> member) {
  return {field,
          [member](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
            if (!v.is_number()) wrong_type(where, "a number", v);
            member(c) = v.get<double>();
          },
          [member](const TorchBridgeConfig& c) { return nlohmann::json(field_value(member, c)); },
          [](const std::string& text, const std::string& where) {
            try {
              std::size_t used = 0;
              const double value = std::stod(text, &used);
              if (used == text.size()) return nlohmann::json(value);
            } catch (const std::exception&) {
            }
            TORCH_CHECK_VALUE(false, where, ": expected a number, got '", text, "'");
          }};
}

FieldCodec integer_field(ConfigField field, FieldOf<int64_t> member) {
  return {field,
          [member](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
            if (!v.is_number_integer()) wrong_type(where, "an integer", v);
            member(c) = v.get<int64_t>();
          },
          [member](const TorchBridgeConfig& c) { return nlohmann::json(field_value(member, c)); },
          [](const std::string& text, const std::string& where) {
            return nlohmann::json(parse_integer(text, where, INT64_MIN, INT64_MAX));
          }};
}

const std::vector<FieldCodec>& codecs() {
  static const std::vector<FieldCodec> rows = {
      string_field({"backend", "string", "TORCHBRIDGE_BACKEND",
                    "backend name or alias (cuda, nvidia, rocm, cpu, emu, ...), or \"auto\" for the best one here"},
                   [](TorchBridgeConfig& c) -> std::string& { return c.backend; }),
      {{"device_index", "integer", "TORCHBRIDGE_DEVICE_INDEX", "which device of the backend (0-based)"},
       [](TorchBridgeConfig& c, const nlohmann::json& v, const std::string& where) {
         if (!v.is_number_integer()) wrong_type(where, "an integer", v);
         // Past INT64_MAX, get<int64_t>() wrapped 2^63 to a negative number in the message.
         TORCH_CHECK_VALUE(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{1} << 20, where,
                           ": expected a device index from 0 to ", 1 << 20, ", got ", v.get<uint64_t>());
         const int64_t index = v.get<int64_t>();
         TORCH_CHECK_VALUE(index >= 0 && index <= 1 << 20, where, ": expected a device index from 0 to ", 1 << 20,
                           ", got ", index);
         c.device_index = static_cast<int>(index);
       },
       [](const TorchBridgeConfig& c) { return nlohmann::json(c.device_index); },
       [](const std::string& text, const std::string& where) {
         return nlohmann::json(parse_integer(text, where, 0, 1 << 20));
       }},
      string_field({"precision", "string", "TORCHBRIDGE_PRECISION",
                    "\"auto\" (the fastest precision the hardware accelerates) or fp64, fp32, tf32, bf16, fp16, fp8"},
                   [](TorchBridgeConfig& c) -> std::string& { return c.precision; }),
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
                    [](TorchBridgeConfig& c) -> bool& { return c.training; }),
      boolean_field({"compile", "boolean", "TORCHBRIDGE_COMPILE",
                     "O2 and up compile the model where the front end can (Python: torch.compile)"},
                    [](TorchBridgeConfig& c) -> bool& { return c.compile; }),
      boolean_field({"deterministic", "boolean", "TORCHBRIDGE_DETERMINISTIC",
                     "deterministic algorithms only, and no timing-based kernel selection"},
                    [](TorchBridgeConfig& c) -> bool& { return c.deterministic; }),
      boolean_field({"validation", "boolean", "TORCHBRIDGE_VALIDATION",
                     "optimize() with example inputs checks the optimized outputs against the original model in "
                     "float64 on the CPU"},
                    [](TorchBridgeConfig& c) -> bool& { return c.validation; }),
      boolean_field({"activation_checkpointing", "boolean", "TORCHBRIDGE_ACTIVATION_CHECKPOINTING",
                     "training recomputes each block's activations in backward instead of keeping them "
                     "(Python: the blocks of the model's first nn.Sequential/nn.ModuleList)"},
                    [](TorchBridgeConfig& c) -> bool& { return c.activation_checkpointing; }),
      // Vendor sections (hardware_config.h says what each does and where it applies).
      boolean_field({"hardware.nvidia.fp8_enabled", "boolean", "TORCHBRIDGE_HARDWARE_NVIDIA_FP8_ENABLED",
                     "NVIDIA sm_89+: O3 makes eligible Linear layers FP8 layers, whatever the precision"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.nvidia.fp8_enabled; }),
      string_field({"hardware.nvidia.flash_attention_version", "string",
                    "TORCHBRIDGE_HARDWARE_NVIDIA_FLASH_ATTENTION_VERSION",
                    "\"auto\", \"2\" (torch's FlashAttention-2) or \"3\" (FlashAttention-3, sm_90) for "
                    "scaled_dot_product_attention"},
                   [](TorchBridgeConfig& c) -> std::string& { return c.hardware.nvidia.flash_attention_version; }),
      boolean_field({"hardware.nvidia.enable_oom_protection", "boolean",
                     "TORCHBRIDGE_HARDWARE_NVIDIA_ENABLE_OOM_PROTECTION",
                     "a forward that runs out of GPU memory frees cached blocks and is retried once (Python)"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.nvidia.enable_oom_protection; }),
      string_field({"hardware.amd.architecture", "string", "TORCHBRIDGE_HARDWARE_AMD_ARCHITECTURE",
                    "\"auto\" or CDNA1-4 / RDNA2-4: checked against the GPU's gfx target"},
                   [](TorchBridgeConfig& c) -> std::string& { return c.hardware.amd.architecture; }),
      boolean_field({"hardware.amd.enable_matrix_cores", "boolean", "TORCHBRIDGE_HARDWARE_AMD_ENABLE_MATRIX_CORES",
                     "false: no reduced precision on the matrix cores (auto precision becomes fp32)"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.amd.enable_matrix_cores; }),
      number_field({"hardware.amd.memory_pool_size_gb", "number", "TORCHBRIDGE_HARDWARE_AMD_MEMORY_POOL_SIZE_GB",
                    "> 0: cap the caching allocator at this many GB (0: no cap)"},
                   [](TorchBridgeConfig& c) -> double& { return c.hardware.amd.memory_pool_size_gb; }),
      boolean_field({"hardware.intel.enable_ipex", "boolean", "TORCHBRIDGE_HARDWARE_INTEL_ENABLE_IPEX",
                     "run intel_extension_for_pytorch.optimize() on the model (Python; must be installed)"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.intel.enable_ipex; }),
      boolean_field({"hardware.intel.enable_onednn", "boolean", "TORCHBRIDGE_HARDWARE_INTEL_ENABLE_ONEDNN",
                     "false: torch's oneDNN (mkldnn) CPU kernels off"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.intel.enable_onednn; }),
      boolean_field({"hardware.intel.enable_amx", "boolean", "TORCHBRIDGE_HARDWARE_INTEL_ENABLE_AMX",
                     "false is refused on CPUs with AMX (set ONEDNN_MAX_CPU_ISA before the process starts)"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.intel.enable_amx; }),
      string_field({"hardware.tpu.precision", "string", "TORCHBRIDGE_HARDWARE_TPU_PRECISION",
                    "\"bfloat16\" or \"float32\" on TPUs"},
                   [](TorchBridgeConfig& c) -> std::string& { return c.hardware.tpu.precision; }),
      boolean_field({"hardware.tpu.enable_xla_cache", "boolean", "TORCHBRIDGE_HARDWARE_TPU_ENABLE_XLA_CACHE",
                     "torch_xla's persistent compilation cache on TPUs"},
                    [](TorchBridgeConfig& c) -> bool& { return c.hardware.tpu.enable_xla_cache; }),
      integer_field({"hardware.tpu.cache_max_size", "integer", "TORCHBRIDGE_HARDWARE_TPU_CACHE_MAX_SIZE",
                     "entries in the XLA cache (torch_xla has no limit to set: only the default is accepted on TPUs)"},
                    [](TorchBridgeConfig& c) -> int64_t& { return c.hardware.tpu.cache_max_size; }),
  };
  return rows;
}

std::string valid_keys() {
  std::string keys;
  for (const auto& codec : codecs()) keys += (keys.empty() ? "" : ", ") + std::string(codec.field.name);
  return keys;
}

// "; did you mean 'hardware.nvidia.fp8_enabled'?" for a near miss, otherwise "".
std::string suggestion_for(const std::string& key) {
  std::vector<std::string> names;
  for (const auto& codec : codecs()) names.emplace_back(codec.field.name);
  const std::string closest = closest_name(key, names);
  return closest.empty() ? "" : "; did you mean '" + closest + "'?";
}

// True when `key` names a section ("hardware", "hardware.nvidia") rather than a field.
bool is_section(const std::string& key) {
  const std::string prefix = key + ".";
  return std::any_of(codecs().begin(), codecs().end(),
                     [&](const FieldCodec& c) { return std::string_view(c.field.name).starts_with(prefix); });
}

// The document's fields as dotted keys: sections may be nested objects or dotted keys.
void flatten(const nlohmann::json& object, const std::string& prefix,
             std::vector<std::pair<std::string, const nlohmann::json*>>& fields) {
  for (const auto& item : object.items()) {
    const std::string key = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (item.value().is_object() && is_section(key)) {
      flatten(item.value(), key, fields);
    } else {
      fields.emplace_back(key, &item.value());
    }
  }
}

TorchBridgeConfig from_json(const nlohmann::json& document, TorchBridgeConfig config, std::string_view source) {
  TORCH_CHECK_VALUE(document.is_object(), source, ": expected a JSON object of configuration fields, got ",
                    document.type_name());
  std::vector<std::pair<std::string, const nlohmann::json*>> fields;
  flatten(document, "", fields);
  std::set<std::string> given;
  for (const auto& field : fields) {
    const std::string& key = field.first;
    // One field as a nested section and as a dotted key ({"hardware": {"intel": {...}}} and
    // "hardware.intel.enable_onednn"): which should win is not the reader's to guess.
    TORCH_CHECK_VALUE(given.insert(key).second, source, ": '", key,
                      "' is given twice (once as a dotted key, once inside its section)");
    const nlohmann::json* value = field.second;
    const auto codec = std::find_if(codecs().begin(), codecs().end(),
                                    [&](const FieldCodec& c) { return key == c.field.name; });
    if (codec == codecs().end()) {
      const std::string suggestion = suggestion_for(key);
      TORCH_CHECK_VALUE(false, source, ": unknown key '", key, "'",
                        suggestion.empty() ? "; the configuration has " : suggestion + " The configuration has ",
                        valid_keys());
    }
    codec->read(config, *value, std::string(source) + ": '" + key + "'");
  }
  try {
    validate(config);
  } catch (const c10::ValueError& e) {  // "precision: unknown precision 'fp4'" named no file or variable
    TORCH_CHECK_VALUE(false, source, ": ", e.msg());
  }
  return config;
}

// "hardware.nvidia.fp8_enabled" -> the JSON pointer /hardware/nvidia/fp8_enabled.
nlohmann::json::json_pointer pointer_to(std::string_view dotted) {
  std::string path = "/";
  for (const char c : dotted) path += c == '.' ? '/' : c;
  return nlohmann::json::json_pointer(path);
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
  validate(config.hardware);
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
  // A key given twice in one object is refused, as TOML refuses it (nlohmann keeps the last).
  const auto on_problem = [&](detail::JsonProblem problem, const std::string& key,
                              const std::vector<std::string>& /*enclosing_keys*/) {
    TORCH_CHECK_VALUE(problem != detail::JsonProblem::too_deep, source, ": JSON nests deeper than ",
                      kMaxConfigDepth, " levels");
    TORCH_CHECK_VALUE(false, source, ": key '", key, "' is given twice in one object");
  };
  try {
    document = detail::parse_json_strictly(json, kMaxConfigDepth, on_problem);
  } catch (const nlohmann::json::parse_error& e) {
    TORCH_CHECK_VALUE(false, source, ": not valid JSON (", e.what(), ")");
  }
  return from_json(document, base, source);
}

std::string to_json_text(const TorchBridgeConfig& config, int indent) {
  nlohmann::json document = nlohmann::json::object();
  for (const auto& codec : codecs()) document[pointer_to(codec.field.name)] = codec.write(config);
  return document.dump(indent);
}

TorchBridgeConfig load_config(const std::string& path, const TorchBridgeConfig& base) {
  // A directory opens as a stream, and reading it raised libstdc++'s "basic_filebuf::underflow".
  std::error_code no_file;
  TORCH_CHECK_VALUE(!std::filesystem::is_directory(path, no_file), "configuration file '", path,
                    "' is a directory; expected a .json or .toml file");
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK_VALUE(file, "cannot read the configuration file '", path, "': ", std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (path.ends_with(".json")) return config_from_json_text(text, base, path);
  if (path.ends_with(".toml")) return from_json(optimize_detail::parse_flat_toml(text, path), base, path);
  TORCH_CHECK_VALUE(false, "configuration file '", path, "': expected a .json or .toml file");
}

TorchBridgeConfig with_environment(TorchBridgeConfig config, const std::function<const char*(const char*)>& getenv) {
  const auto lookup = getenv ? getenv : [](const char* name) -> const char* { return std::getenv(name); };
  nlohmann::json overrides = nlohmann::json::object();
  std::string variables;  // the ones set, named in errors
  for (const auto& codec : codecs()) {
    const char* value = lookup(codec.field.environment);
    if (value == nullptr || *value == '\0') continue;  // empty counts as unset, as for TORCHBRIDGE_BACKEND
    overrides[codec.field.name] = codec.from_text(value, codec.field.environment);
    variables += std::string(variables.empty() ? "" : ", ") + codec.field.environment + "='" + value + "'";
  }
  return from_json(overrides, std::move(config), "environment (" + variables + ")");
}

}  // namespace torchbridge

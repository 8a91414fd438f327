#include "checkpoint/training_metadata.h"

#include "checkpoint/optimizer_codec.h"

#include <torchbridge/parse_integer.h>

#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

const std::string& required(const std::map<std::string, std::string>& metadata, const std::string& key,
                            const std::string& path) {
  const auto it = metadata.find(key);
  TORCH_CHECK_VALUE(it != metadata.end(), path, ": the training state's metadata has no '", key,
                    "' (a truncated or foreign file?)");
  return it->second;
}

nlohmann::json parse_json_object(const std::string& text, const std::string& where) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, where, " is not JSON (", e.what(), ")");
  }
  TORCH_CHECK_VALUE(value.is_object(), where, " is not a JSON object but ", value.type_name());
  return value;
}

nlohmann::json parse_optimizer(const std::string& text, const std::string& path) {
  const std::string where = path + ": metadata 'torchbridge.optimizer'";
  const nlohmann::json description = parse_json_object(text, where);
  TORCH_CHECK_VALUE(description.contains("type") && description.at("type").is_string(), where,
                    " has no optimizer type");
  const std::string type = description.at("type").get<std::string>();
  const OptimizerCodec* codec = codec_named(type);
  TORCH_CHECK_VALUE(codec != nullptr, where, " names optimizer '", type, "'; TorchBridge restores ",
                    supported_optimizer_types());
  TORCH_CHECK_VALUE(description.contains("groups") && description.at("groups").is_array(), where,
                    " has no list of parameter groups");
  const auto& groups = description.at("groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group_where = where + " group " + std::to_string(g);
    codec->check_group(groups[g], group_where);
    TORCH_CHECK_VALUE(groups[g].contains("size") && groups[g].at("size").is_number_unsigned(), group_where,
                      " has no parameter count 'size'");
  }
  return description;
}

// torch.amp.GradScaler.state_dict(): exactly its five entries, each of its JSON type. Whether the
// values make a valid scaler is GradScaler::load_state_dict's to check, as in torch.
amp::GradScalerState parse_grad_scaler(const std::string& text, const std::string& path) {
  const std::string where = path + ": metadata 'torchbridge.grad_scaler'";
  const nlohmann::json state = parse_json_object(text, where);
  const auto number = [&](const char* key, bool integer) -> const nlohmann::json& {
    TORCH_CHECK_VALUE(state.contains(key), where, " has no '", key, "'");
    const nlohmann::json& value = state.at(key);
    TORCH_CHECK_VALUE(integer ? value.is_number_integer() : value.is_number(), where, " '", key, "' is ",
                      value.dump(), ", expected ", integer ? "an integer" : "a number");
    return value;
  };
  TORCH_CHECK_VALUE(state.size() == 5, where, " has ", state.size(),
                    " entries; a GradScaler state has scale, growth_factor, backoff_factor, growth_interval "
                    "and _growth_tracker");
  return {number("scale", false).get<double>(), number("growth_factor", false).get<double>(),
          number("backoff_factor", false).get<double>(), number("growth_interval", true).get<int64_t>(),
          number("_growth_tracker", true).get<int64_t>()};
}

}  // namespace

std::string grad_scaler_to_json(const amp::GradScalerState& state) {
  return nlohmann::json{{"scale", state.scale},
                        {"growth_factor", state.growth_factor},
                        {"backoff_factor", state.backoff_factor},
                        {"growth_interval", state.growth_interval},
                        {"_growth_tracker", state.growth_tracker}}
      .dump();
}

TrainingMetadata read_training_metadata(const std::map<std::string, std::string>& metadata, const std::string& path) {
  const auto format = metadata.find("format");
  TORCH_CHECK_VALUE(format != metadata.end() && format->second == kTrainingStateFormat, path,
                    ": not a TorchBridge training state (metadata format is not ", kTrainingStateFormat, ")");
  TrainingMetadata out;
  out.step = parse_integer(required(metadata, "torchbridge.step", path), path + ": metadata 'torchbridge.step'");
  out.epoch = parse_integer(required(metadata, "torchbridge.epoch", path), path + ": metadata 'torchbridge.epoch'");
  out.optimizer = parse_optimizer(required(metadata, "torchbridge.optimizer", path), path);
  for (const auto& [key, value] : metadata) {
    if (key.rfind("user.", 0) == 0) out.user[key.substr(5)] = value;
  }
  if (const auto scaler = metadata.find("torchbridge.grad_scaler"); scaler != metadata.end()) {
    out.grad_scaler = parse_grad_scaler(scaler->second, path);
  }
  if (const auto scheduler = metadata.find("torchbridge.lr_scheduler"); scheduler != metadata.end()) {
    parse_json_object(scheduler->second, path + ": metadata 'torchbridge.lr_scheduler'");
    out.lr_scheduler = scheduler->second;
  }
  return out;
}

}  // namespace torchbridge::checkpoint

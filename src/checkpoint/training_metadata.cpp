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

nlohmann::json parse_optimizer(const std::string& text, const std::string& path) {
  const std::string where = path + ": metadata 'torchbridge.optimizer'";
  nlohmann::json description;
  try {
    description = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, where, " is not JSON (", e.what(), ")");
  }
  TORCH_CHECK_VALUE(description.is_object() && description.contains("type") && description.at("type").is_string(),
                    where, " has no optimizer type");
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

}  // namespace

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
  return out;
}

}  // namespace torchbridge::checkpoint

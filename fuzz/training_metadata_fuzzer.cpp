// libFuzzer target for the training state's metadata (`__metadata__`: step, epoch, and the
// optimizer description as JSON), read by read_training_metadata before a restore changes
// anything. Each input is either a JSON object of strings (the whole metadata) or, when it is
// not, the text of the `torchbridge.optimizer` entry beside valid other entries. It must read the
// metadata or raise a c10::Error — never crash, read out of bounds or throw anything else — and
// a description it accepts must be usable by its optimizer's codec.
// Build and run with scripts/fuzz_training_metadata.sh, seeded with metadata of real files.
#include "checkpoint/optimizer_codec.h"
#include "checkpoint/training_metadata.h"

#include <nlohmann/json.hpp>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace {

using torchbridge::checkpoint::codec_named;
using torchbridge::checkpoint::read_training_metadata;

std::map<std::string, std::string> metadata_from(const std::string& text) {
  std::map<std::string, std::string> metadata;
  const auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) {
    for (const auto& [key, value] : parsed.items()) {
      if (value.is_string()) metadata[key] = value.get<std::string>();
    }
    return metadata;
  }
  return {{"format", torchbridge::checkpoint::kTrainingStateFormat},
          {"torchbridge.step", "5"},
          {"torchbridge.epoch", "0"},
          {"torchbridge.optimizer", text}};
}

// Default options of each type, as a restore would clone them from the optimizer it is given.
std::unique_ptr<torch::optim::OptimizerOptions> default_options(const std::string& type) {
  if (type == "SGD") return std::make_unique<torch::optim::SGDOptions>(0.1);
  if (type == "Adam") return std::make_unique<torch::optim::AdamOptions>();
  return std::make_unique<torch::optim::AdamWOptions>();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto metadata = read_training_metadata(metadata_from(text), "fuzz.safetensors");
    const std::string type = metadata.optimizer.at("type").get<std::string>();
    const auto* codec = codec_named(type);
    const auto current = default_options(type);
    for (const auto& group : metadata.optimizer.at("groups")) (void)codec->group_from_json(*current, group);
  } catch (const c10::Error&) {
    // Rejecting malformed metadata with an error is the expected outcome.
  }
  return 0;
}

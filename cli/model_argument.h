#pragma once
// The --model argument of `validate` and `export`: builtin:NAME or a TorchScript file.

#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::cli {

struct ModelArgument {
  torch::jit::Module module;
  std::string label;                                 // "builtin:mlp" or the file name
  std::optional<std::vector<int64_t>> input_shape;   // known for built-in models
};

// Raises UsageError for an unknown built-in name, a missing file, or a file that is not a
// TorchScript module, each naming the value.
ModelArgument load_model_argument(const std::string& spec);
// "4,16,32" or several inputs "4,16,32;4,16"; raises UsageError naming the bad text.
std::vector<std::vector<int64_t>> parse_input_shapes(const std::string& text);
// The --input-shape value when given, else the built-in model's own; a file without one raises
// UsageError saying what the shape is `needed_for`.
std::vector<std::vector<int64_t>> input_shapes_for(const ModelArgument& model, const std::string* option,
                                                   const std::string& needed_for);

}  // namespace torchbridge::cli

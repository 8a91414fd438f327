#pragma once
// Small built-in models for `torchbridge validate`, `torchbridge export` and the portability run:
// TorchScript modules built in C++ (so they can be trained and validated from C++, saved as
// TorchScript files, and loaded by Python's torch.jit.load), initialised from a seed.

#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchbridge::validation {

struct BuiltinModel {
  std::string name;                 // mlp, cnn, transformer
  std::string description;          // one line
  std::vector<int64_t> input_shape; // the shape validate uses by default (batch first)
};

const std::vector<BuiltinModel>& builtin_models();
// The model's description; unknown names raise listing the known ones.
const BuiltinModel& builtin_model_info(const std::string& name);
// A freshly initialised instance (parameters from `seed`, so two calls with one seed are equal).
torch::jit::Module make_builtin_model(const std::string& name, uint64_t seed = 0);

}  // namespace torchbridge::validation

#include <torchbridge/module_state.h>

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

namespace torchbridge {

NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors state;
  for (const auto& p : module.named_parameters()) state.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) state.emplace_back(b.key(), b.value());
  return state;
}

NamedTensors module_state(const torch::jit::Module& module) {
  NamedTensors state;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) state.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state.emplace_back(b.name, b.value);
  return state;
}

}  // namespace torchbridge

#pragma once
// A module's parameters then buffers, by dotted name: all that checkpoints and the validator need
// of a model, whether it is a torch::nn or a TorchScript module.

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::jit {
struct Module;
}

namespace torchbridge {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

NamedTensors module_state(const torch::nn::Module& module);
NamedTensors module_state(const torch::jit::Module& module);

}  // namespace torchbridge

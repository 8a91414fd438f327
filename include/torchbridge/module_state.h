#pragma once
// A module's parameters then buffers, by dotted name: all that checkpoints and the validator need
// of a model, whether it is a torch::nn or a TorchScript module.

#include <ATen/core/Tensor.h>

#include <map>
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

// A state as a checkpoint can hold it: names that are the very same tensor (an embedding tied to
// the output layer: same storage, offset, shape, strides, dtype, conjugate and negative bits) are
// stored once, under the first of them. Empty tensors are never taken as tied.
struct UntiedState {
  NamedTensors stored;                      // each distinct tensor, under its first name, in order
  std::map<std::string, std::string> tied;  // every other name -> the name it is stored under
};
UntiedState store_tied_once(const NamedTensors& state);

}  // namespace torchbridge

#include <torchbridge/module_state.h>

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

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

UntiedState store_tied_once(const NamedTensors& state) {
  using View = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>, c10::ScalarType, bool, bool>;
  std::map<View, std::string> stored_as;
  UntiedState out;
  for (const auto& [name, tensor] : state) {
    if (tensor.defined() && tensor.numel() > 0) {
      const View view{tensor.storage().data(), tensor.storage_offset(), tensor.sizes().vec(), tensor.strides().vec(),
                      tensor.scalar_type(), tensor.is_conj(), tensor.is_neg()};
      const auto [it, inserted] = stored_as.emplace(view, name);
      if (!inserted) {
        out.tied.emplace(name, it->second);
        continue;
      }
    }
    out.stored.emplace_back(name, tensor);
  }
  return out;
}

}  // namespace torchbridge

// State dicts written by Python's torch.save (zip format), read in C++ through torch's own
// unpickler, so checkpoints from Python training scripts enter the same device-map/dtype pipeline.
#include <torchbridge/checkpoint/checkpoint.h>

#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <fstream>
#include <iterator>

namespace torchbridge::checkpoint {

std::vector<std::pair<std::string, at::Tensor>> read_torch_save(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), path, ": cannot open");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    // LibTorch's unpickler reads collections.OrderedDict (what Module.state_dict() returns) as
    // None by design, and then fails on the items it cannot add to it.
    const bool ordered_dict = e.msg().find("Expected GenericDict but got None") != std::string::npos;
    TORCH_CHECK_VALUE(!ordered_dict, path, ": holds a collections.OrderedDict (what state_dict() returns), which "
                      "LibTorch's unpickler cannot read; save dict(model.state_dict()) instead, or use safetensors");
    TORCH_CHECK_VALUE(false, path, ": not a torch.save file torch can read: ", e.msg().substr(0, e.msg().find('\n')));
  }
  TORCH_CHECK_VALUE(value.isGenericDict(), path, ": holds a ", value.tagKind(),
                    ", not a state dict (a dict of names to tensors)");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK_VALUE(item.key().isString(), path, ": state dict key ", item.key().tagKind(), " is not a string");
    const std::string name = item.key().toStringRef();
    TORCH_CHECK_VALUE(item.value().isTensor(), path, ": entry '", name, "' is a ", item.value().tagKind(),
                      ", not a tensor");
    tensors.emplace_back(name, item.value().toTensor());
  }
  return tensors;
}

}  // namespace torchbridge::checkpoint

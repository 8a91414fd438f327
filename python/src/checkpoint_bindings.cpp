// torchbridge._C checkpoint functions: the C++ safetensors reader/writer, tensors as DLPack.
#include "dlpack_bridge.h"

#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/checkpoint/training_state.h>

#include <pybind11/stl.h>

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torchbridge::python {

void bind_checkpoint(py::module_& m) {
  m.def("checkpoint_names", [](const std::string& path) { return checkpoint::Checkpoint::open(path).names(); });
  m.def("checkpoint_metadata", [](const std::string& path) { return checkpoint::Checkpoint::open(path).metadata(); });
  // {name: capsule} for `names` (all when empty); CPU tensors alias the file's mapping when aligned.
  // `names`: None loads every tensor; an empty list, none.
  m.def("checkpoint_load", [](const std::string& path, const std::optional<std::vector<std::string>>& names) {
    const auto file = checkpoint::Checkpoint::open(path);
    py::dict out;
    for (const auto& name : names ? *names : file.names()) out[py::str(name)] = to_capsule(file.load(name));
    return out;
  });
  m.def("checkpoint_save", [](const std::string& path, const std::vector<std::pair<std::string, py::capsule>>& items,
                              const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& [name, capsule] : items) tensors.emplace_back(name, from_capsule(capsule));
    if (max_shard_bytes > 0) return checkpoint::save_sharded(path, tensors, max_shard_bytes, metadata);
    checkpoint::save(path, tensors, metadata);
    return std::vector<std::string>{path};
  });
  m.def("parse_size", &checkpoint::parse_size);
  py::tuple scale_suffixes(checkpoint::kFp8ScaleSuffixes.size());
  for (size_t i = 0; i < checkpoint::kFp8ScaleSuffixes.size(); ++i) {
    scale_suffixes[i] = py::str(checkpoint::kFp8ScaleSuffixes[i].data(), checkpoint::kFp8ScaleSuffixes[i].size());
  }
  m.attr("fp8_scale_suffixes") = scale_suffixes;  // where a float8 tensor's factor is stored
  // The training state's "auto" device map, shared with C++ restores: (tensor name, bytes) in model
  // order -> (module prefix, device string) over `backend`'s devices by free memory.
  m.def("auto_device_map", [](const std::vector<std::pair<std::string, int64_t>>& tensor_bytes,
                              const std::string& backend) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [prefix, device] : checkpoint::auto_device_map(tensor_bytes, backend)) {
      out.emplace_back(prefix, device.str());
    }
    return out;
  });
}

}  // namespace torchbridge::python

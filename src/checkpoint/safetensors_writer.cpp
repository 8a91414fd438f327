// Writing: tensors sorted by element size (largest first) so each lands naturally aligned after
// a header padded to a multiple of 8; written to a temporary file that atomically replaces the
// target only once it is complete and on disk.
#include <torchbridge/checkpoint/safetensors.h>

#include "checkpoint/atomic_file.h"
#include "checkpoint/distinct_tensors.h"
#include "checkpoint/staged_publish.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

// The header is JSON, which holds only UTF-8 text (a name made from bytes, e.g. a pickle's
// surrogate escapes, would otherwise fail deep inside the JSON writer, naming nothing).
void check_utf8(const std::string& path, const char* what, const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::type_error&) {
    TORCH_CHECK_VALUE(false, path, ": ", what, " ",
                      nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      " is not valid UTF-8 text, which a safetensors header must be");
  }
}

// PREFIX.safetensors written beside PREFIX.safetensors.index.json would leave a directory holding
// two checkpoints of one name, which readers tell apart differently (transformers reads the single
// file, Checkpoint::open refuses to guess).
void refuse_beside_an_index(const std::string& path) {
  const std::string_view suffix = ".safetensors";
  if (!path.ends_with(suffix)) return;
  const std::string index = path.substr(0, path.size() - suffix.size()) + kIndexSuffix;
  std::error_code no_file;
  TORCH_CHECK_VALUE(!std::filesystem::exists(index, no_file), path, ": ", index,
                    " beside it names a sharded checkpoint, and a directory holding both is ambiguous; save the "
                    "checkpoint to the directory with a shard size (it replaces the sharded one whole), or remove "
                    "the index and its shards first");
}

// A single file named *.json would be read as JSON by every tool, and under a sharded checkpoint's
// index name (save("dir/model.safetensors.index.json", ...)) it replaced the index, leaving the
// shards unreadable.
void refuse_a_json_name(const std::string& path) {
  TORCH_CHECK_VALUE(!path.ends_with(".json"), path,
                    ": names a JSON file; a single safetensors file needs another name (a sharded save, with a "
                    "shard size, writes its index itself, into the directory it is given)");
}

}  // namespace

void save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata) {
  refuse_a_json_name(path);
  refuse_beside_an_index(path);
  DistinctTensors distinct(path);
  std::vector<std::pair<std::string, at::Tensor>> prepared;
  for (const auto& [name, tensor] : tensors) {
    // "" is a valid name (the safetensors package takes it); "__metadata__" is the header's own key.
    TORCH_CHECK_VALUE(name != "__metadata__", path, ": invalid tensor name '", name, "'");
    check_utf8(path, "tensor name", name);
    TORCH_CHECK_VALUE(tensor.defined(), path, ": tensor '", name, "' is undefined");
    // What the copy to the host below would fail on, naming no file or tensor.
    TORCH_CHECK_VALUE(tensor.layout() == c10::kStrided, path, ": tensor '", name, "' is a ", tensor.layout(),
                      " tensor; safetensors holds dense (strided) tensors: save to_dense(), or its indices and values");
    TORCH_CHECK_VALUE(!tensor.is_meta(), path, ": tensor '", name, "' is on the meta device, which holds no data");
    TORCH_CHECK_VALUE(!tensor.is_quantized(), path, ": tensor '", name, "' is quantized, which safetensors cannot "
                      "hold: save its int_repr() and its quantization parameters");
    TORCH_CHECK_VALUE(holds_dtype(tensor.scalar_type()), path, ": tensor '", name, "' has dtype ",
                      c10::toString(tensor.scalar_type()), ", which safetensors cannot hold");
    TORCH_CHECK_VALUE(tensor.dim() > 0 || values_per_element(tensor.scalar_type()) == 1, path, ": tensor '", name,
                      "' is a 0-dim ", c10::toString(tensor.scalar_type()), ", whose two values safetensors' ",
                      safetensors_dtype_name(tensor.scalar_type()), " can only count along a dimension; reshape it to [1]");
    distinct.add(name, tensor);
    // resolve_conj/resolve_neg: a conjugate or negative view is lazy, a bit over the same bytes, and
    // contiguous() keeps the bit, so writing the storage as it is would save the unconjugated values.
    prepared.emplace_back(name, tensor.cpu().resolve_conj().resolve_neg().contiguous());
  }
  std::stable_sort(prepared.begin(), prepared.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() != b.second.element_size() ? a.second.element_size() > b.second.element_size()
                                                              : a.first < b.first;
  });

  for (const auto& [key, value] : metadata) {
    check_utf8(path, "metadata key", key);
    check_utf8(path, "metadata value", value);
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : prepared) {
    const uint64_t bytes = tensor.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(tensor.scalar_type())},
                    {"shape", safetensors_shape(tensor.scalar_type(), tensor.sizes())},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  TORCH_CHECK_VALUE(text.size() <= kMaxHeaderBytes, path, ": the header of ", prepared.size(), " tensors would take ",
                    text.size(), " bytes, over the format's limit of ", kMaxHeaderBytes,
                    " (no reader accepts it); save them in shards");
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data section starts 8-byte aligned
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  AtomicFile file(path);
  file.write(length, sizeof(length));
  file.write(text.data(), text.size());
  for (const auto& [name, tensor] : prepared) file.write(tensor.data_ptr(), tensor.nbytes());
  file.commit();
}

}  // namespace torchbridge::checkpoint

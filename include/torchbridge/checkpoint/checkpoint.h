#pragma once
// A checkpoint on disk: one safetensors file, or a sharded directory in the Hugging Face layout
// (model-00001-of-0000N.safetensors ... plus model.safetensors.index.json with its weight_map).

#include <torchbridge/checkpoint/safetensors.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {

class Checkpoint {
 public:
  // `path` is a .safetensors file, an index .json, or a directory holding either
  // model.safetensors.index.json or model.safetensors. Every shard is opened and validated, and
  // the index must agree with the shards exactly.
  static Checkpoint open(const std::string& path);

  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  bool sharded() const { return !index_file_.empty(); }
  const std::string& index_file() const { return index_file_; }
  std::vector<std::string> names() const;  // every tensor, in shard order
  bool contains(const std::string& name) const { return owner_.count(name) > 0; }
  const SafetensorsFile& shard_of(const std::string& name) const;  // raises naming the missing tensor
  at::Tensor load(const std::string& name, c10::Device device = c10::Device(c10::kCPU)) const {
    return shard_of(name).load(name, device);
  }
  // Metadata of the first shard (Hugging Face writes the same into each).
  const std::map<std::string, std::string>& metadata() const { return shards_.front().metadata(); }

 private:
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> owner_;
  std::string index_file_;
};

// Whether `file_name` is one of the files a directory checkpoint named `prefix` consists of
// (PREFIX.safetensors, its index, PREFIX-NNNNN-of-NNNNN.safetensors), which save_sharded replaces.
bool is_checkpoint_file(const std::string& file_name, const std::string& prefix = "model");
// Whether `file_name` is one numbered shard of such a checkpoint (PREFIX-NNNNN-of-NNNNN.safetensors):
// a part of it, where PREFIX.safetensors and the index each stand for the whole.
bool is_checkpoint_shard_file(const std::string& file_name, const std::string& prefix = "model");

// Writes `tensors` into `directory` (created if missing) as shards of at most `max_shard_bytes`
// each (a larger tensor gets a shard of its own), in the given order, plus the index; a single
// shard is written as model.safetensors without an index, as Hugging Face does. Every file is
// written atomically. Returns the written file names (shards, then the index).
std::vector<std::string> save_sharded(const std::string& directory,
                                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                      uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {},
                                      const std::string& prefix = "model");

// The tensors of a state dict saved by Python's torch.save (zip format, pickle protocols 2-5), in
// the file's order, on the CPU. The top level is a dict or collections.OrderedDict (what
// state_dict() returns; its _metadata attribute, module versions, is dropped); nested dicts add
// their entries with dotted names ({"model": {"w": t}} gives "model.w"). Values are tensors or
// nn.Parameters of any dtype torch saves, with their offsets and strides; conjugate/negative bits
// are resolved. Entries that share a storage in the file share it here, as with torch.load.
// Anything else (a list, an int entry, a non-str key, any other Python object) raises naming the
// file and the entry; no Python code is ever run. The legacy pre-zip format is refused.
std::vector<std::pair<std::string, at::Tensor>> read_torch_save(const std::string& path);

// Whether `path` is a regular file that begins as torch.save writes one (a zip archive, or the
// legacy format's pickle), whatever its name: how `checkpoint convert` picks its reader.
bool is_torch_save_file(const std::string& path);

// The names a float8 tensor's dequantization factor is stored under: `<name>_scale` in
// compressed-tensors' files, `<name>_scale_inv` (the inverse of the quantizing scale) in
// DeepSeek-V3's, transformers' fine-grained FP8, Transformer Engine's and this project's fp8.h.
// Both hold the factor that turns the stored values back into real ones; the first found is used.
inline constexpr std::array<std::string_view, 2> kFp8ScaleSuffixes = {"_scale", "_scale_inv"};

// Parses sizes such as "5GB", "500MB", "10MiB" or "1048576" (GB/MB/KB or kB are powers of 1000
// as Hugging Face uses them; GiB/MiB/KiB powers of 1024). A unit ending in a lowercase b ("5Gb",
// bits to transformers) is refused.
uint64_t parse_size(const std::string& text);

}  // namespace torchbridge::checkpoint

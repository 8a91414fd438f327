// State dicts written by Python's torch.save (zip format), read in C++ so checkpoints from Python
// training scripts enter the same device-map/dtype pipeline. The zip container is read with
// LibTorch's PyTorchStreamReader; data.pkl runs through our pickle machine (pickle.h) with the
// few Python globals a state dict uses given meaning here: collections.OrderedDict (what
// state_dict() returns), torch._utils._rebuild_tensor_v2/_v3 and _rebuild_parameter, the
// storage classes and dtypes. Storages are loaded once per key, so tensors that share one in
// the file share it here, as with torch.load.
#include <torchbridge/checkpoint/checkpoint.h>

#include "checkpoint/pickle.h"
#include "checkpoint/torch_save_signature.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

using Kind = PickleValue::Kind;

// "torch.float32" (a dtype global, as _rebuild_tensor_v3 receives it) -> kFloat.
std::optional<c10::ScalarType> dtype_of_global(const std::string& global) {
  if (global.rfind("torch.", 0) != 0) return std::nullopt;
  const std::string name = global.substr(6);
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto dtype = static_cast<c10::ScalarType>(i);
    const auto [python_name, legacy_name] = c10::getDtypeNames(dtype);
    if (!python_name.empty() && (name == python_name || name == legacy_name)) return dtype;
  }
  return std::nullopt;
}

// "torch.FloatStorage" (a typed storage class) -> kFloat; UntypedStorage holds bytes.
std::optional<c10::ScalarType> dtype_of_storage_class(const std::string& global) {
  if (global == "torch.storage.UntypedStorage" || global == "torch.UntypedStorage") return c10::ScalarType::Byte;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto dtype = static_cast<c10::ScalarType>(i);
    if (global == std::string("torch.") + c10::toString(dtype) + "Storage") return dtype;
  }
  return std::nullopt;
}

class TorchSaveReader {
 public:
  explicit TorchSaveReader(const std::string& path) : path_(path), zip_(open_zip(path)) {}

  PickleRef read() {
    if (zip_->hasRecord("byteorder")) {
      const auto [data, size] = zip_->getRecord("byteorder");
      const std::string order(static_cast<const char*>(data.get()), size);
      TORCH_CHECK_VALUE(order == "little", path_, ": tensors were saved ", order, "-endian; only little-endian is read");
    }
    TORCH_CHECK_VALUE(zip_->hasRecord("data.pkl"), path_, ": the archive has no data.pkl, so torch.save did not write it");
    const auto [pickle, size] = zip_->getRecord("data.pkl");
    PickleHooks hooks;
    hooks.reduce = [this](const PickleValue& callable, const PickleValue& args) { return reduce(callable, args); };
    hooks.build = [this](PickleValue& object, const PickleValue& state) { build(object, state); };
    hooks.persistent_load = [this](const PickleValue& id) { return load_storage(id); };
    return unpickle(std::string_view(static_cast<const char*>(pickle.get()), size), hooks, path_);
  }

 private:
  static std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_zip(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    TORCH_CHECK_VALUE(in.good(), path, ": cannot open");
    char start[kLegacyTorchSaveSignatureBytes] = {};
    in.read(start, sizeof start);
    TORCH_CHECK_VALUE(!begins_as_legacy_torch_save(start, static_cast<size_t>(in.gcount())), path,
                      ": a torch.save file in the legacy format (torch < 1.6 or "
                      "_use_new_zipfile_serialization=False), which is not read; re-save it with a current torch.save");
    try {
      return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, path, ": not a torch.save zip archive (", zip_reader_reason(e.msg()), ")");
    }
  }

  // The reader's reason without its source location: "[enforce fail at inline_container.cc:123]
  // . file in archive is not in a subdirectory: w.npy" reads "file in archive is not in ...". The
  // reader copies a file name with its terminating NUL, which would end the message there.
  static std::string zip_reader_reason(const std::string& message) {
    std::string reason = message.substr(0, message.find_first_of(std::string("\n\0", 2)));
    if (reason.starts_with("[enforce fail at ")) reason = reason.substr(std::min(reason.find(']') + 1, reason.size()));
    const auto start = reason.find_first_not_of(" .");
    return start == std::string::npos ? "the zip reader gave no reason" : reason.substr(start);
  }

  template <typename... Args>
  [[noreturn]] void fail(const Args&... message) const {
    C10_THROW_ERROR(ValueError, c10::str(path_, ": ", message...));
  }
  const PickleValue& argument(const PickleValue& args, size_t i, Kind kind, const std::string& function,
                              const char* what) const {
    if (i >= args.items.size() || args.items[i]->kind != kind) {
      fail(function, " argument ", i + 1, " (", what, ") is ",
           i < args.items.size() ? args.items[i]->description() : std::string("missing"));
    }
    return *args.items[i];
  }
  std::vector<int64_t> int_tuple(const PickleValue& args, size_t i, const std::string& function,
                                 const char* what) const {
    std::vector<int64_t> out;
    for (const auto& item : argument(args, i, Kind::tuple, function, what).items) {
      if (item->kind != Kind::integer) fail(function, " argument ", i + 1, " (", what, ") holds ", item->description());
      out.push_back(item->integer);
    }
    return out;
  }

  PickleRef reduce(const PickleValue& callable, const PickleValue& args) {
    const std::string& name = callable.text;
    auto result = std::make_shared<PickleValue>();
    if (name == "collections.OrderedDict") {
      // pickle writes OrderedDict(), then fills it with SETITEMS.
      if (!args.items.empty()) fail("collections.OrderedDict called with ", args.items.size(), " arguments");
      result->kind = Kind::dict;
      result->ordered = true;
    } else if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor_v3") {
      result->kind = Kind::tensor;
      result->tensor = rebuild_tensor(name, args, name.back() == '3');
    } else if (name == "torch._utils._rebuild_parameter") {  // (data, requires_grad, backward_hooks)
      return std::make_shared<PickleValue>(argument(args, 0, Kind::tensor, name, "data"));
    } else {
      fail("the pickle calls ", name, ", which a state dict does not hold (read: tensors, parameters, dicts, "
           "OrderedDicts, and plain Python values)");
    }
    return result;
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata]);
  // v3 adds the dtype after backward_hooks, for dtypes saved with an untyped storage.
  at::Tensor rebuild_tensor(const std::string& function, const PickleValue& args, bool v3) {
    const auto& storage_value = argument(args, 0, Kind::tensor, function, "storage");
    const auto offset = argument(args, 1, Kind::integer, function, "storage offset").integer;
    const auto sizes = int_tuple(args, 2, function, "size");
    const auto strides = int_tuple(args, 3, function, "stride");
    if (sizes.size() != strides.size()) fail(function, ": ", sizes.size(), " sizes but ", strides.size(), " strides");
    c10::ScalarType dtype = storage_value.tensor.scalar_type();
    if (v3) {
      const std::string& global = argument(args, 6, Kind::global, function, "dtype").text;
      const auto parsed = dtype_of_global(global);
      if (!parsed) fail(function, ": unknown dtype ", global);
      if (c10::isQIntType(*parsed)) fail(function, ": quantized dtype ", global, " is not read");
      dtype = *parsed;
    }
    at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(dtype));
    try {  // set_ checks that the view stays inside the storage
      tensor.set_(storage_value.tensor.storage(), offset, sizes, strides);
    } catch (const c10::Error& e) {
      fail("a tensor does not fit its storage: ", e.msg().substr(0, e.msg().find('\n')));
    }
    const size_t metadata_at = v3 ? 7 : 6;  // conj/neg bits; the values are resolved here
    if (args.items.size() > metadata_at && args.items[metadata_at]->kind == Kind::dict) {
      for (const auto& [key, value] : args.items[metadata_at]->entries) {
        const bool set = value->kind == Kind::boolean && value->integer != 0;
        if (key->kind == Kind::string && key->text == "conj") {
          if (set) tensor = tensor.conj().resolve_conj();  // stored data is the conjugate
        } else if (key->kind == Kind::string && key->text == "neg") {
          if (set) tensor = tensor.neg();
        } else {
          fail(function, ": unknown tensor metadata ", key->kind == Kind::string ? key->text : key->type_name());
        }
      }
    }
    return tensor;
  }

  // ('storage', storage class, key, location, numel): the record data/<key> of the archive.
  PickleRef load_storage(const PickleValue& id) {
    const bool shape = id.kind == Kind::tuple && id.items.size() == 5 && id.items[0]->kind == Kind::string &&
                       id.items[0]->text == "storage" && id.items[1]->kind == Kind::global &&
                       id.items[2]->kind == Kind::string && id.items[4]->kind == Kind::integer;
    if (!shape) fail("persistent id is ", id.description(), ", not ('storage', class, key, location, numel)");
    const std::string& key = id.items[2]->text;
    const auto dtype = dtype_of_storage_class(id.items[1]->text);
    if (!dtype) fail("storage ", key, " has unknown class ", id.items[1]->text);
    if (c10::isQIntType(*dtype)) fail("storage ", key, " is quantized (", id.items[1]->text, "), which is not read");
    auto result = std::make_shared<PickleValue>();
    result->kind = Kind::tensor;
    auto cached = storages_.find(key);
    if (cached == storages_.end()) {
      const int64_t numel = id.items[4]->integer;
      const std::string record = "data/" + key;
      if (numel < 0 || !zip_->hasRecord(record)) fail("storage ", key, " (", numel, " elements) has no record ", record);
      const uint64_t stored = zip_->getRecordSize(record);
      // Compared before multiplying, so a huge element count cannot wrap around to the record size.
      const bool fits = static_cast<uint64_t>(numel) <= stored;
      const uint64_t bytes = static_cast<uint64_t>(numel) * c10::elementSize(*dtype);
      if (!fits || stored != bytes) {
        fail("record ", record, " holds ", stored, " bytes, but its storage of ", numel, " ", c10::toString(*dtype),
             " elements needs ", fits ? std::to_string(bytes) : std::string("more"));
      }
      at::Storage storage(c10::Storage::use_byte_size_t(), bytes, c10::GetCPUAllocator(), /*resizable=*/false);
      if (bytes > 0) zip_->getRecord(record, storage.mutable_data(), bytes);
      cached = storages_.emplace(key, storage).first;
    }
    // A storage travels as a 1-D tensor over all of it, carrying its dtype.
    const c10::Storage& storage = cached->second;
    result->tensor = at::empty({0}, at::TensorOptions().dtype(*dtype));
    result->tensor.set_(storage, 0, {static_cast<int64_t>(storage.nbytes() / c10::elementSize(*dtype))}, {1});
    return result;
  }

  // state_dict() sets the OrderedDict's _metadata attribute (module versions for
  // _load_from_state_dict); it holds no tensors and is dropped. Any other BUILD is refused.
  void build(PickleValue& object, const PickleValue& state) const {
    const bool attributes = state.kind == Kind::dict &&
                            std::all_of(state.entries.begin(), state.entries.end(),
                                        [](const auto& entry) { return entry.first->kind == Kind::string; });
    if (!(object.kind == Kind::dict && object.ordered && attributes)) {
      fail("the pickle sets the state of ", object.description(), " from ", state.description(),
           "; a state dict has no such object");
    }
  }

  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip_;
  std::map<std::string, c10::Storage> storages_;
};

// More entries than any state dict has (the safetensors header limit holds about a million). A
// pickle may refer to one dict many times (its memo): 60 levels of {'a': d, 'b': d} are 700 bytes
// on disk and 2^60 entries when flattened, so the walk counts what it visits.
constexpr size_t kMaxFlattenedEntries = size_t(1) << 22;

// Entries of `dict` in order; nested dicts contribute their entries as "outer.inner".
void flatten(const std::string& path, const PickleValue& dict, const std::string& prefix, int depth,
             std::vector<std::pair<std::string, at::Tensor>>& out, size_t& visited) {
  TORCH_CHECK_VALUE(depth < 64, path, ": dicts nested more than 64 deep at '", prefix, "'");
  visited += dict.entries.size();
  TORCH_CHECK_VALUE(visited <= kMaxFlattenedEntries, path, ": the state dict has more than ", kMaxFlattenedEntries,
                    " entries once its nested dicts are flattened (the pickle refers to the same dicts over and ",
                    "over); no state dict is that large");
  for (const auto& [key, value] : dict.entries) {
    TORCH_CHECK_VALUE(key->kind == Kind::string, path, ": ", prefix.empty() ? "state dict" : "'" + prefix + "'",
                      " has a key of type ", key->type_name(), "; state dict keys are strs");
    const std::string name = prefix.empty() ? key->text : prefix + "." + key->text;
    if (value->kind == Kind::tensor) {
      out.emplace_back(name, value->tensor);
    } else if (value->kind == Kind::dict) {
      flatten(path, *value, name, depth + 1, out, visited);
    } else {
      TORCH_CHECK_VALUE(false, path, ": entry '", name, "' is ", value->description(),
                        ", not a tensor (a state dict maps names to tensors)");
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> read_torch_save(const std::string& path) {
  const PickleRef root = TorchSaveReader(path).read();
  TORCH_CHECK_VALUE(root->kind == Kind::dict, path, ": holds ", root->description(),
                    ", not a state dict (a dict of names to tensors)");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  size_t visited = 0;
  flatten(path, *root, "", 0, tensors, visited);
  return tensors;
}

bool is_torch_save_file(const std::string& path) {
  std::error_code no_file;
  if (!std::filesystem::is_regular_file(path, no_file)) return false;
  std::ifstream in(path, std::ios::binary);
  char start[kLegacyTorchSaveSignatureBytes] = {};
  in.read(start, sizeof start);
  const auto size = static_cast<size_t>(in.gcount());
  return begins_as_zip_archive(start, size) || begins_as_legacy_torch_save(start, size);
}

}  // namespace torchbridge::checkpoint

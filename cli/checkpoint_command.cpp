// `torchbridge checkpoint inspect|verify|convert`: safetensors files through the C++ reader/writer.
#include "arguments.h"
#include "commands.h"
#include "printable_json.h"
#include "text_format.h"

#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/device_info.h>
#include <torchbridge/error_summary.h>
#include <torchbridge/precision.h>

#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge checkpoint COMMAND ...

  inspect PATH [--json]              names, dtypes, shapes, bytes, metadata and shard layout,
                                     without reading tensor data
  verify PATH                        full validation, reading every tensor; exit 0 valid, 1 invalid
  convert IN OUT [--dtype DTYPE] [--shard-size SIZE]
                                     rewrite IN (safetensors, or a torch.save state dict, told
                                     by its content) as OUT (atomically), casting floating-point tensors
                                     to DTYPE (float32, float16, bfloat16, float64, or fp32, fp16,
                                     bf16, fp64); with a shard
                                     size (e.g. 500MB, 2GiB) OUT is a directory of shards + index

PATH is a .safetensors file, a Hugging Face index (*.safetensors.index.json) or a directory
holding model.safetensors.index.json or model.safetensors.
)";

int print_help() {
  std::cout << kHelp;
  return 0;
}

// torch's dtype names or the precision names validate's --dtype takes (fp16 = float16); tf32 and
// fp8 are ways of computing, not storage dtypes a checkpoint is converted to.
c10::ScalarType parse_float_dtype(const std::string& text) {
  const std::string valid = "float32, float16, bfloat16, float64 (or fp32, fp16, bf16, fp64)";
  try {
    const PrecisionSpec& spec = spec_of(parse_precision_or_dtype_name(text));
    if (!spec.tf32_matmuls && spec.compute == spec.storage) return spec.storage;
  } catch (const c10::ValueError&) {
  }
  throw UsageError("unknown --dtype '" + text + "'; valid: " + valid);
}

int inspect(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("checkpoint inspect", args, {{"--json"}, {}, true});
  if (parsed.has("--help")) return print_help();
  if (parsed.positional.size() != 1) throw UsageError("checkpoint inspect needs exactly one PATH");
  const auto checkpoint = checkpoint::Checkpoint::open(parsed.positional[0]);
  uint64_t total = 0;
  nlohmann::json tensors = nlohmann::json::array(), shards = nlohmann::json::array();
  for (const auto& shard : checkpoint.shards()) {
    uint64_t shard_bytes = 0;
    for (const auto& r : shard.tensors()) {
      shard_bytes += r.end - r.begin;
      tensors.push_back({{"name", r.name}, {"dtype", checkpoint::safetensors_dtype_name(r.dtype)},
                         {"shape", checkpoint::safetensors_shape(r.dtype, r.shape)}, {"bytes", r.end - r.begin},
                         {"shard", shard.path()}});
    }
    shards.push_back({{"file", shard.path()}, {"tensors", shard.tensors().size()}, {"bytes", shard_bytes}});
    total += shard_bytes;
  }
  if (parsed.has("--json")) {
    std::cout << printable_json(nlohmann::json({{"path", parsed.positional[0]}, {"sharded", checkpoint.sharded()},
                                 {"index", checkpoint.sharded() ? nlohmann::json(checkpoint.index_file()) : nlohmann::json(nullptr)},
                                 {"shards", shards}, {"tensors", tensors}, {"metadata", checkpoint.metadata()},
                                 {"total_bytes", total}}), 2)
              << "\n";
    return 0;
  }
  std::cout << parsed.positional[0] << ": " << tensors.size() << " tensors, " << format_bytes(int64_t(total))
            << (checkpoint.sharded() ? ", " + std::to_string(shards.size()) + " shards" : "") << "\n";
  for (const auto& shard : shards) {
    if (checkpoint.sharded()) std::cout << "  shard " << shard["file"].get<std::string>() << " ("
                                        << format_bytes(shard["bytes"].get<int64_t>()) << ")\n";
  }
  for (const auto& [key, value] : checkpoint.metadata()) {
    std::cout << "  metadata " << visible(key) << " = " << visible(value) << "\n";
  }
  // Columns as wide as their longest entry: cut names made different tensors look alike
  // (q_proj.weight and q_proj.weight_scale_inv).
  size_t name_width = 0, shape_width = 0;
  for (const auto& t : tensors) {
    name_width = std::max(name_width, visible(t["name"].get<std::string>()).size());
    shape_width = std::max(shape_width, t["shape"].dump().size());
  }
  for (const auto& t : tensors) {
    std::cout << "  " << column(visible(t["name"].get<std::string>()), name_width + 2)
              << column(t["dtype"].get<std::string>(), 9) << column(t["shape"].dump(), shape_width + 2)
              << format_bytes(t["bytes"].get<int64_t>()) << "\n";
  }
  return 0;
}

int verify(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("checkpoint verify", args, {{}, {}, true});
  if (parsed.has("--help")) return print_help();
  if (parsed.positional.size() != 1) throw UsageError("checkpoint verify needs exactly one PATH");
  try {
    const auto checkpoint = checkpoint::Checkpoint::open(parsed.positional[0]);
    const auto names = checkpoint.names();
    for (const auto& name : names) {
      // Summing the raw bytes reads every page of every tensor, whatever its dtype.
      (void)checkpoint.load(name).reshape(-1).view(at::kByte).sum().item<int64_t>();
    }
    std::cout << parsed.positional[0] << ": valid (" << names.size() << " tensors in " << checkpoint.shards().size()
              << (checkpoint.shards().size() == 1 ? " file)\n" : " shards)\n");
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "torchbridge: invalid: " << error_summary(e.msg()) << "\n";
    return 1;
  }
}

// IN was not told to be a torch.save file, so it is read as safetensors; a single file that is
// neither says so, since the reader alone would only name what its header lacks.
checkpoint::Checkpoint open_as_safetensors(const std::string& in) {
  std::error_code no_file;
  if (in.ends_with(".json") || !std::filesystem::is_regular_file(in, no_file)) return checkpoint::Checkpoint::open(in);
  try {
    return checkpoint::Checkpoint::open(in);
  } catch (const c10::ValueError& error) {
    TORCH_CHECK_VALUE(false, error.msg(), " (read as safetensors: it does not begin as a torch.save file does, ",
                      "with a zip archive or a pickle, either)");
  }
}

int convert(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("checkpoint convert", args, {{}, {"--dtype", "--shard-size"}, true});
  if (parsed.has("--help")) return print_help();
  if (parsed.positional.size() != 2) throw UsageError("checkpoint convert needs IN and OUT");
  std::optional<c10::ScalarType> dtype;
  if (const std::string* text = parsed.option("--dtype")) dtype = parse_float_dtype(*text);
  std::optional<uint64_t> shard_size;
  if (const std::string* text = parsed.option("--shard-size")) shard_size = checkpoint::parse_size(*text);
  const std::string& in = parsed.positional[0];
  const std::string& out = parsed.positional[1];
  if (out.empty()) throw UsageError("checkpoint convert: OUT is empty; expected a file or directory path");
  // By the file's first bytes: torch.save files come named .pt, .pth, .bin, .ckpt or .tar.
  const bool from_torch_save = checkpoint::is_torch_save_file(in);
  // Rewriting a safetensors file or a sharded directory in place is safe (the input stays mapped
  // while the new files replace it atomically). Anything else written over its input destroys it:
  // a torch.save file would become a safetensors file torch.load refuses, an index a binary file.
  std::error_code no_file;
  if (std::filesystem::is_regular_file(out, no_file) && std::filesystem::equivalent(in, out, no_file) &&
      (from_torch_save || in.ends_with(".json"))) {
    throw UsageError("checkpoint convert: OUT '" + out + "' is the input itself, which is no safetensors file; " +
                     "write the conversion to another path");
  }
  // A sharded write replaces the checkpoint in OUT, so an input that is one shard of it (a part,
  // not the whole) would be converted alone and the other shards deleted.
  const std::filesystem::path in_path(in);
  if (shard_size && std::filesystem::is_regular_file(in_path, no_file) &&
      std::filesystem::equivalent(in_path.has_parent_path() ? in_path.parent_path() : ".", out, no_file) &&
      checkpoint::is_checkpoint_shard_file(in_path.filename().string())) {
    throw UsageError("checkpoint convert: IN '" + in + "' is one shard of the checkpoint in OUT '" + out +
                     "', which a sharded write replaces (the other shards would be deleted); convert the " +
                     "directory or its index, or write to another directory");
  }
  if (!shard_size && std::filesystem::is_directory(out, no_file)) {
    throw UsageError("checkpoint convert: OUT '" + out + "' is a directory; give --shard-size SIZE to write a " +
                     "sharded checkpoint into it, or the path of a .safetensors file");
  }
  if (!shard_size && out.ends_with(".json")) {
    throw UsageError("checkpoint convert: OUT '" + out + "' names a JSON file; a single safetensors file needs " +
                     "another name (an index is written with --shard-size, OUT a directory)");
  }
  const bool progress = isatty(STDERR_FILENO) != 0;  // a progress line only for a person watching
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
  if (from_torch_save) {
    tensors = checkpoint::read_torch_save(in);
    metadata["format"] = "pt";
    // torch.save keeps entries that share a storage (tied weights, views) shared; safetensors
    // stores every tensor on its own, so each later sharer is written as a copy, and said so.
    std::map<const c10::StorageImpl*, std::string> owners;
    for (auto& [name, tensor] : tensors) {
      if (tensor.storage().nbytes() == 0) continue;
      const auto [owner, fresh] = owners.emplace(tensor.storage().unsafeGetStorageImpl(), name);
      if (fresh) continue;
      std::cerr << "torchbridge: note: '" << name << "' shares storage with '" << owner->second << "' in " << in
                << "; written as a separate copy\n";
      tensor = tensor.clone();
    }
  } else {
    const auto input = open_as_safetensors(in);
    metadata = input.metadata();
    for (const auto& name : input.names()) tensors.emplace_back(name, input.load(name));
  }
  // --dtype casts the full-precision floating-point tensors. Quantized weights (every float8
  // dtype) and their scaling factors (checkpoint::kFp8ScaleSuffixes) stay as they are: a cast
  // would drop the scaling that gives the stored values their meaning, and turn e8m0 scales
  // (up to 2^127) into infinities in float16.
  std::set<std::string> quantized;
  for (const auto& [name, tensor] : tensors) {
    if (c10::isFloat8Type(tensor.scalar_type())) quantized.insert(name);
  }
  const auto is_scale_of_quantized = [&](const std::string& name) {
    for (const std::string_view suffix : checkpoint::kFp8ScaleSuffixes) {
      if (name.ends_with(suffix) && quantized.count(name.substr(0, name.size() - suffix.size())) > 0) return true;
    }
    return false;
  };
  size_t kept = 0;
  // What a narrowing cast loses, counted so that it is said: float16's range ends at 65504.
  int64_t overflowed = 0, flushed = 0;
  std::vector<std::string> losing;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& [name, tensor] = tensors[i];
    if (dtype && tensor.is_floating_point()) {
      if (quantized.count(name) > 0 || is_scale_of_quantized(name)) {
        kept += quantized.count(name);  // the tensors themselves, not their scales
      } else {
        const at::Tensor original = tensor;
        tensor = tensor.to(*dtype);
        const int64_t to_infinity =
            original.isfinite().logical_and(tensor.isfinite().logical_not()).sum().item<int64_t>();
        const int64_t to_zero = original.ne(0).logical_and(tensor.eq(0)).sum().item<int64_t>();
        if (to_infinity + to_zero > 0) losing.push_back(name);
        overflowed += to_infinity;
        flushed += to_zero;
      }
    }
    if (progress) std::cerr << "\rconverting " << i + 1 << "/" << tensors.size() << " tensors" << std::flush;
  }
  if (progress && (kept > 0 || !losing.empty())) std::cerr << "\n";
  if (kept > 0) {
    std::cerr << "torchbridge: note: kept " << kept << " quantized tensor(s) (float8) and their scales as they are; "
              << "--dtype casts full-precision tensors only\n";
  }
  if (!losing.empty()) {
    std::cerr << "torchbridge: warning: --dtype " << *parsed.option("--dtype") << " turned " << overflowed
              << " finite values into infinities and " << flushed << " nonzero values into zeros, in " << losing.size()
              << (losing.size() == 1 ? " tensor" : " tensors") << " (first: '" << losing.front()
              << "'); they lie outside its range (bfloat16 keeps float32's)\n";
  }
  if (shard_size) {
    const auto files = checkpoint::save_sharded(out, tensors, *shard_size, metadata);
    if (progress) std::cerr << "\n";
    // A single shard is model.safetensors alone; more come with the index, named after them.
    const size_t shards = files.size() == 1 ? 1 : files.size() - 1;
    std::cout << out << ": wrote " << tensors.size() << " tensors in " << shards << (shards == 1 ? " shard" : " shards")
              << (files.size() > 1 ? " and " + files.back() : std::string()) << "\n";
    return 0;
  }
  checkpoint::save(out, tensors, metadata);
  if (progress) std::cerr << "\n";
  std::cout << out << ": wrote " << tensors.size() << " tensors\n";
  return 0;
}

}  // namespace

int run_checkpoint(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kHelp;
    return args.empty() ? 1 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "inspect") return inspect(rest);
  if (args[0] == "verify") return verify(rest);
  if (args[0] == "convert") return convert(rest);
  throw UsageError("unknown checkpoint command '" + args[0] + "'; valid: inspect, verify, convert");
}

}  // namespace torchbridge::cli

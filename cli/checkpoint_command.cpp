// `torchbridge checkpoint inspect|verify|convert`: safetensors files through the C++ reader/writer.
#include "arguments.h"
#include "commands.h"
#include "text_format.h"

#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/device_info.h>

#include <ATen/ops/sum.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <iostream>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge checkpoint COMMAND ...

  inspect FILE [--json]              names, dtypes, shapes, bytes and metadata, without reading data
  verify FILE                        full validation, reading every tensor; exit 0 valid, 1 invalid
  convert IN OUT [--dtype DTYPE]     rewrite IN as OUT (atomically), casting floating-point tensors
                                     to DTYPE (float32, float16, bfloat16, float64) when given
)";

c10::ScalarType parse_float_dtype(const std::string& text) {
  for (const auto dtype : {c10::kFloat, c10::kHalf, c10::kBFloat16, c10::kDouble}) {
    if (text == dtype_name(dtype)) return dtype;
  }
  throw UsageError("unknown --dtype '" + text + "'; valid: float32, float16, bfloat16, float64");
}

int inspect(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("checkpoint inspect", args, {{"--json"}, {}, true});
  if (parsed.positional.size() != 1) throw UsageError("checkpoint inspect needs exactly one FILE");
  const auto file = checkpoint::SafetensorsFile::open(parsed.positional[0]);
  uint64_t total = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& r : file.tensors()) {
    total += r.end - r.begin;
    tensors.push_back({{"name", r.name}, {"dtype", checkpoint::safetensors_dtype_name(r.dtype)},
                       {"shape", r.shape}, {"bytes", r.end - r.begin}, {"data_offsets", {r.begin, r.end}}});
  }
  if (parsed.has("--json")) {
    std::cout << nlohmann::json({{"file", file.path()}, {"tensors", tensors}, {"metadata", file.metadata()},
                                 {"total_bytes", total}}).dump(2)
              << "\n";
    return 0;
  }
  std::cout << file.path() << ": " << file.tensors().size() << " tensors, " << format_bytes(int64_t(total)) << "\n";
  for (const auto& [key, value] : file.metadata()) std::cout << "  metadata " << key << " = " << value << "\n";
  for (const auto& t : tensors) {
    std::cout << "  " << column(t["name"].get<std::string>(), 40) << column(t["dtype"].get<std::string>(), 9)
              << column(t["shape"].dump(), 20) << format_bytes(t["bytes"].get<int64_t>()) << "\n";
  }
  return 0;
}

int verify(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("checkpoint verify", args, {{}, {}, true});
  if (parsed.positional.size() != 1) throw UsageError("checkpoint verify needs exactly one FILE");
  try {
    const auto file = checkpoint::SafetensorsFile::open(parsed.positional[0]);
    for (const auto& r : file.tensors()) {
      // Summing the raw bytes reads every page of every tensor, whatever its dtype.
      (void)file.load(r.name).reshape(-1).view(at::kByte).sum().item<int64_t>();
    }
    std::cout << file.path() << ": valid (" << file.tensors().size() << " tensors)\n";
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "torchbridge: invalid: " << first_line(e.msg()) << "\n";
    return 1;
  }
}

int convert(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("checkpoint convert", args, {{}, {"--dtype"}, true});
  if (parsed.positional.size() != 2) throw UsageError("checkpoint convert needs IN and OUT");
  std::optional<c10::ScalarType> dtype;
  if (const std::string* text = parsed.option("--dtype")) dtype = parse_float_dtype(*text);
  const auto input = checkpoint::SafetensorsFile::open(parsed.positional[0]);
  const bool progress = isatty(STDERR_FILENO) != 0;  // a progress line only for a person watching
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  size_t done = 0;
  for (const auto& r : input.tensors()) {
    at::Tensor t = input.load(r.name);
    if (dtype && t.is_floating_point()) t = t.to(*dtype);
    tensors.emplace_back(r.name, t);
    if (progress) std::cerr << "\rconverting " << ++done << "/" << input.tensors().size() << " tensors" << std::flush;
  }
  checkpoint::save(parsed.positional[1], tensors, input.metadata());
  if (progress) std::cerr << "\n";
  std::cout << parsed.positional[1] << ": wrote " << tensors.size() << " tensors\n";
  return 0;
}

}  // namespace

int run_checkpoint(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help") {
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

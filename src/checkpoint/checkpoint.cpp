#include <torchbridge/checkpoint/checkpoint.h>

#include "checkpoint/atomic_file.h"
#include "checkpoint/distinct_tensors.h"
#include "checkpoint/staged_publish.h"
#include "core/to_lower.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <system_error>

namespace torchbridge::checkpoint {
namespace {

bool is_directory(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_directory(path, error);
}

bool exists(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Shards named "model-00002-of-00003.safetensors" say how many there are: an index that maps no
// tensor to one of them lost that shard's tensors (loading returned the others, and verify called
// the checkpoint valid). Checked where every shard carries such a name.
void check_every_numbered_shard_mapped(const std::string& index_file, const std::map<std::string, size_t>& shards) {
  std::map<size_t, std::set<size_t>> numbers_by_count;
  static const std::regex numbered(R"(.+-(\d{5})-of-(\d{5})\.safetensors)");
  for (const auto& [shard, unused] : shards) {
    std::smatch match;
    if (!std::regex_match(shard, match, numbered)) return;  // named otherwise: nothing says how many there are
    const size_t number = std::stoul(match[1]), count = std::stoul(match[2]);
    numbers_by_count[count].insert(number);
  }
  for (const auto& [count, numbers] : numbers_by_count) {
    for (size_t number = 1; number <= count; ++number) {
      TORCH_CHECK_VALUE(numbers.count(number), index_file, ": the shards are numbered 1 to ", count,
                        ", but the weight_map maps no tensor to shard ", number, " of ", count,
                        ": its tensors would be missing (an index from another save, or one edited by hand)");
    }
  }
}

// A directory that a save creates, removed (if still empty) when the save fails before keep().
class NewDirectory {
 public:
  explicit NewDirectory(const std::string& path) {
    if (is_directory(path)) return;
    std::error_code error;
    std::filesystem::create_directory(path, error);
    TORCH_CHECK(!error, path, ": cannot create the directory: ", error.message());
    path_ = path;
  }
  ~NewDirectory() {
    if (!kept_ && !path_.empty()) ::rmdir(path_.c_str());  // fails, harmlessly, unless empty
  }
  NewDirectory(const NewDirectory&) = delete;
  NewDirectory& operator=(const NewDirectory&) = delete;
  void keep() { kept_ = true; }

 private:
  std::string path_;
  bool kept_ = false;
};

std::string shard_name(const std::string& prefix, size_t index, size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "-%05zu-of-%05zu.safetensors", index, count);
  return prefix + buffer;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

bool all_digits(const std::string& text, size_t begin, size_t count) {
  for (size_t i = begin; i < begin + count; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

// A directory without a checkpoint may be one whose save was killed while publishing: the earlier
// checkpoint then waits, whole, in a directory of its own, which the reader needs to hear of.
std::string interrupted_publish_advice(const std::string& directory) {
  const auto previous = interrupted_publishes(directory);
  if (previous.empty()) return "";
  std::string advice = "; a save into it was interrupted while replacing its files, and the earlier checkpoint's "
                       "files are in ";
  for (size_t i = 0; i < previous.size(); ++i) advice += (i ? ", " : "") + previous[i];
  return advice + " (move them back into " + directory + " to use it)";
}

}  // namespace

// Shards of any count (as transformers' save_pretrained, which also clears these before it writes).
bool is_checkpoint_file(const std::string& file, const std::string& prefix) {
  return file == prefix + ".safetensors" || file == prefix + kIndexSuffix || is_checkpoint_shard_file(file, prefix);
}

bool is_checkpoint_shard_file(const std::string& file, const std::string& prefix) {
  const std::string middle = "-of-", suffix = ".safetensors";
  const size_t at = prefix.size();
  return file.size() == at + 1 + 5 + middle.size() + 5 + suffix.size() && file.compare(0, at, prefix) == 0 &&
         file[at] == '-' && all_digits(file, at + 1, 5) && file.compare(at + 6, middle.size(), middle) == 0 &&
         all_digits(file, at + 10, 5) && file.compare(at + 15, suffix.size(), suffix) == 0;
}

uint64_t parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  TORCH_CHECK_VALUE(digits > 0, "invalid size '", text, "': expected a number with an optional unit such as 500MB or 2GiB");
  // Digits only, so the one way to fail is a number past 2^64.
  uint64_t number = 0;
  const auto parsed = std::from_chars(text.data(), text.data() + digits, number);
  TORCH_CHECK_VALUE(parsed.ec == std::errc(), "invalid size '", text, "': more than 2^64 bytes");
  const std::string unit = text.substr(digits);
  // "kB" is the SI spelling of a kilobyte, which transformers' max_shard_size also reads.
  const std::pair<const char*, uint64_t> units[] = {{"", 1}, {"B", 1}, {"KB", 1000}, {"kB", 1000}, {"MB", 1000'000},
                                                     {"GB", 1000'000'000}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20},
                                                     {"GiB", 1ull << 30}};
  for (const auto& [name, factor] : units) {
    if (unit == name) {
      TORCH_CHECK_VALUE(number > 0, "invalid size '", text, "': must be positive");
      TORCH_CHECK_VALUE(number <= std::numeric_limits<uint64_t>::max() / factor, "invalid size '", text,
                        "': more than 2^64 bytes");
      return number * factor;
    }
  }
  // transformers reads "5Gb" as gigabits (an eighth of "5GB"): guessing either way would be a wrong size.
  if (unit.ends_with('b')) {
    // The byte unit meant, spelled as this parser reads it ("10mb" -> "10MB", not "10mB").
    const std::string bytes_unit = detail::to_lower(unit.substr(0, unit.size() - 1) + "B");
    for (const auto& [name, factor] : units) {
      TORCH_CHECK_VALUE(detail::to_lower(name) != bytes_unit, "invalid size '", text, "': unit '", unit,
                        "' ends in a lowercase b, which reads as bits; write B for bytes (e.g. ",
                        text.substr(0, digits), name, ")");
    }
  }
  TORCH_CHECK_VALUE(false, "invalid size '", text, "': unknown unit '", unit,
                    "' (use B, kB or KB, MB, GB, KiB, MiB or GiB)");
}

Checkpoint Checkpoint::open(const std::string& given_path) {
  // "ckpt/" names the directory "ckpt": its files are "ckpt/model...", not "ckpt//model...".
  std::string path = given_path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string target = path;
  if (is_directory(path)) {
    // transformers reads the single file where both are present, an index-first reader the shards;
    // two readers must never see different weights in one directory, so neither is guessed.
    TORCH_CHECK_VALUE(!(exists(path + "/model" + kIndexSuffix) && exists(path + "/model.safetensors")), path,
                      ": directory holds both model.safetensors and model", kIndexSuffix,
                      ", two checkpoints that may hold different tensors; open the one you mean by its path, or "
                      "remove the other");
    if (exists(path + "/model" + kIndexSuffix)) target = path + "/model" + kIndexSuffix;
    else if (exists(path + "/model.safetensors")) target = path + "/model.safetensors";
    else TORCH_CHECK_VALUE(false, path, ": directory holds neither model", kIndexSuffix, " nor model.safetensors",
                           interrupted_publish_advice(path));
  }
  Checkpoint checkpoint;
  if (target.size() < 5 || target.substr(target.size() - 5) != ".json") {
    checkpoint.shards_.push_back(SafetensorsFile::open(target));
    for (const auto& r : checkpoint.shards_.front().tensors()) checkpoint.owner_[r.name] = 0;
    return checkpoint;
  }
  checkpoint.index_file_ = target;
  std::ifstream in(target);
  TORCH_CHECK_VALUE(in.good(), target, ": cannot open the index");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, target, ": index is not valid JSON: ", e.what());
  }
  TORCH_CHECK_VALUE(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), target,
                    ": index lacks a \"weight_map\" object");
  // Shards open in file-name order (model-00001-of-N first), whatever order the map lists them in.
  std::map<std::string, size_t> shard_numbers;
  const std::string directory = directory_of(target);
  for (const auto& [name, file] : index["weight_map"].items()) {
    TORCH_CHECK_VALUE(file.is_string(), target, ": weight_map entry for '", name, "' must be a file name");
    const std::string shard = file.get<std::string>();
    TORCH_CHECK_VALUE(shard.find('/') == std::string::npos && !shard.empty() && shard != "." && shard != "..",
                      target, ": shard '", shard, "' must be a plain file name");
    shard_numbers.emplace(shard, 0);
  }
  // Nothing to read from: every later step (metadata, the first shard) needs one.
  TORCH_CHECK_VALUE(!shard_numbers.empty(), target, ": the index's weight_map maps no tensors");
  check_every_numbered_shard_mapped(target, shard_numbers);
  for (auto& [shard, number] : shard_numbers) {
    number = checkpoint.shards_.size();
    checkpoint.shards_.push_back(SafetensorsFile::open(directory + "/" + shard));
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    const std::string shard = file.get<std::string>();
    const size_t owner = shard_numbers.at(shard);
    TORCH_CHECK_VALUE(checkpoint.shards_[owner].contains(name), target, ": tensor '", name, "' is mapped to ", shard,
                      ", which does not hold it");
    checkpoint.owner_[name] = owner;
  }
  for (const auto& shard : checkpoint.shards_) {
    for (const auto& r : shard.tensors()) {
      const auto it = checkpoint.owner_.find(r.name);
      TORCH_CHECK_VALUE(it != checkpoint.owner_.end() && checkpoint.shards_[it->second].path() == shard.path(), target,
                        ": shard ", shard.path(), " holds tensor '", r.name, "', which the weight_map does not map to it");
    }
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  for (const auto& shard : shards_) {
    for (const auto& r : shard.tensors()) names.push_back(r.name);
  }
  return names;
}

const SafetensorsFile& Checkpoint::shard_of(const std::string& name) const {
  const auto it = owner_.find(name);
  TORCH_CHECK_VALUE(it != owner_.end(), sharded() ? index_file_ : shards_.front().path(), ": no tensor named '", name, "'");
  return shards_[it->second];
}

std::vector<std::string> save_sharded(const std::string& directory,
                                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                      uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata,
                                      const std::string& prefix) {
  TORCH_CHECK_VALUE(max_shard_bytes > 0, directory, ": the maximum shard size must be positive");
  // The prefix names files inside `directory`: "../model" wrote over another checkpoint beside
  // it, and "" gave "-00001-of-00002.safetensors" files and a hidden index no reader finds.
  TORCH_CHECK_VALUE(!prefix.empty() && prefix != "." && prefix != ".." && prefix.find('/') == std::string::npos &&
                        prefix.find('\0') == std::string::npos,
                    directory, ": invalid file prefix '", prefix,
                    "': expected a file name stem such as \"model\" (no '/', not empty, '.' or '..')");
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> groups(1);
  uint64_t current = 0, total = 0;
  for (const auto& entry : tensors) {
    const uint64_t bytes = entry.second.numel() * entry.second.element_size();
    if (!groups.back().empty() && current + bytes > max_shard_bytes) {
      groups.emplace_back();
      current = 0;
    }
    groups.back().push_back(entry);
    current += bytes;
    total += bytes;
  }
  // Checked over all shards here, not in a staged file's name: save() checks one shard, so a name
  // given twice or two tensors sharing storage could land in two shards, each written, with the
  // index keeping one (and Checkpoint::open refusing the result).
  DistinctTensors distinct(directory);
  for (const auto& [name, tensor] : tensors) {
    distinct.add(name, tensor);
    TORCH_CHECK_VALUE(!tensor.defined() || holds_dtype(tensor.scalar_type()), directory, ": tensor '", name,
                      "' has dtype ", c10::toString(tensor.scalar_type()), ", which safetensors cannot hold");
  }
  // Created after the checks above and removed again when writing fails, so that a refused or
  // failed save leaves no empty directory behind.
  NewDirectory created(directory);
  // Every file is written in a staging directory first, so a failure (a tensor safetensors cannot
  // hold, a full disk) leaves the directory as it was: writing shards in place left a mix of new
  // and old shards that the old index called valid.
  const StagingDirectory staging(directory);
  std::vector<std::string> written;
  if (groups.size() == 1) {
    written.push_back(prefix + ".safetensors");
    save(staging.path() + "/" + written.back(), groups.front(), metadata);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::string name = shard_name(prefix, i + 1, groups.size());
      save(staging.path() + "/" + name, groups[i], metadata);
      for (const auto& entry : groups[i]) weight_map[entry.first] = name;
      written.push_back(name);
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text_atomically(staging.path() + "/" + prefix + kIndexSuffix, index.dump(2));
    written.push_back(prefix + kIndexSuffix);
  }
  publish(staging, directory, written, prefix);
  created.keep();
  return written;
}

}  // namespace torchbridge::checkpoint

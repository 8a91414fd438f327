#include "checkpoint/staged_publish.h"

#include "checkpoint/atomic_file.h"

#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/remove_tree.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>

namespace torchbridge::checkpoint {
namespace {

constexpr const char* kPreviousPrefix = ".torchbridge-previous-";

void move(const std::string& from, const std::string& to, const char* what) {
  TORCH_CHECK(::rename(from.c_str(), to.c_str()) == 0, to, ": cannot move ", what, " into place: ",
              std::strerror(errno));
}

std::string make_unique_directory(const std::string& pattern_prefix) {
  std::string pattern = pattern_prefix + "XXXXXX";
  TORCH_CHECK(::mkdtemp(pattern.data()) != nullptr, pattern_prefix, "XXXXXX: cannot create the directory: ",
              std::strerror(errno));
  return pattern;
}

}  // namespace

StagingDirectory::StagingDirectory(const std::string& directory)
    : path_(make_unique_directory(directory + "/.torchbridge-staging-")) {}

StagingDirectory::~StagingDirectory() {
  try {
    remove_tree(path_);
  } catch (const std::exception&) {  // a destructor must not throw; a hidden directory is left
  }
}

void publish(const StagingDirectory& staging, const std::string& directory, const std::vector<std::string>& files,
             const std::string& prefix) {
  std::vector<std::string> earlier;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (is_checkpoint_file(name, prefix)) earlier.push_back(name);
  }
  TORCH_CHECK(!error, directory, ": cannot list the directory: ", error.message());
  // The earlier checkpoint is set aside whole before any new file takes a name, its index first:
  // until the new index is in place a reader finds no index rather than one naming shards being
  // replaced, and a process killed on the way leaves every earlier file in one of two places.
  std::string previous;
  if (!earlier.empty()) {
    const std::string index = prefix + kIndexSuffix;
    std::stable_partition(earlier.begin(), earlier.end(), [&](const std::string& name) { return name == index; });
    previous = make_unique_directory(directory + "/" + kPreviousPrefix);
    for (const std::string& name : earlier) {
      move(directory + "/" + name, previous + "/" + name, "the earlier checkpoint's file");
    }
    fsync_directory(previous);
    fsync_directory(directory);
  }
  for (const std::string& file : files) move(staging.path() + "/" + file, directory + "/" + file, "the written file");
  fsync_directory(directory);
  if (previous.empty()) return;
  try {
    remove_tree(previous);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, directory, ": the new checkpoint is in place, but the earlier one's files could not be removed ",
                "from ", previous, ": ", e.msg());
  }
}

std::vector<std::string> interrupted_publishes(const std::string& directory) {
  std::vector<std::string> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPreviousPrefix, 0) == 0 && entry.is_directory(error)) found.push_back(directory + "/" + name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace torchbridge::checkpoint

#pragma once
// Writing a checkpoint of several files (shards and their index) so that neither a failure nor a
// crash loses the one it replaces. Every new file is written in a staging directory beside the
// checkpoint; publishing then moves the earlier checkpoint's files into a directory of their own
// (`.torchbridge-previous-XXXXXX`), moves the new ones in (the index last), and removes the earlier
// ones. A process killed while publishing leaves the earlier checkpoint whole in that directory,
// and Checkpoint::open names it. Internal to the checkpoint layer.

#include <string>
#include <vector>

namespace torchbridge::checkpoint {

// A sharded checkpoint's index is PREFIX + this ("model.safetensors.index.json").
inline constexpr const char* kIndexSuffix = ".safetensors.index.json";

// A directory beside the checkpoint's files where its new files are written; removed with whatever
// it still holds when the write fails.
class StagingDirectory {
 public:
  explicit StagingDirectory(const std::string& directory);
  ~StagingDirectory();
  StagingDirectory(const StagingDirectory&) = delete;
  StagingDirectory& operator=(const StagingDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Moves the staged `files` (named as they will be in `directory`; the index, if any, last) into
// `directory` in place of the checkpoint named `prefix` there (is_checkpoint_file), as above.
void publish(const StagingDirectory& staging, const std::string& directory, const std::vector<std::string>& files,
             const std::string& prefix);

// The directories in `directory` that hold an earlier checkpoint set aside by a publish that did
// not finish (the process was killed); empty when there are none.
std::vector<std::string> interrupted_publishes(const std::string& directory);

}  // namespace torchbridge::checkpoint

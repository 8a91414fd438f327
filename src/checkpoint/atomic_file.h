#pragma once
// A file that replaces `target` atomically: written to a temporary file in the same directory,
// fsync'ed, renamed over the target, then the directory fsync'ed, so a crash at any point leaves
// either the old file or the complete new one. Destroyed uncommitted, it removes the temporary.
// Internal to the checkpoint module.

#include <string>

namespace torchbridge::checkpoint {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string target_, directory_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace torchbridge::checkpoint

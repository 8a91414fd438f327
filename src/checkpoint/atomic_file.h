#pragma once
// A file that replaces `target` atomically: written to a temporary file in the same directory,
// fsync'ed, renamed over the target, then the directory fsync'ed, so a crash at any point leaves
// either the old file or the complete new one. The temporary is unnamed (O_TMPFILE) where the
// filesystem allows, so a process killed while writing leaves nothing behind; it is named only
// just before the rename. Destroyed uncommitted, it removes the temporary.
// Internal to the checkpoint module.

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchbridge::checkpoint {

// Makes the directory's entries (a rename into it, a new name) durable; a failure raises naming
// the directory and the operating system's reason.
void fsync_directory(const std::string& directory);

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends `bytes`; writeback to the disk starts every kWritebackChunk bytes.
  void write(const void* data, size_t bytes);
  void commit();

  // True while the data has no name in the directory (O_TMPFILE); false on filesystems without
  // O_TMPFILE, where a named `TARGET.tmp-XXXXXX` holds it.
  bool unnamed() const;

  static constexpr size_t kWritebackChunk = size_t{64} << 20;

 private:
  void start_writeback(uint64_t written);
  void name_unnamed_file();

  std::string target_, directory_;
  std::string path_;  // the temporary's name; empty while it has none
  int fd_ = -1;
  bool committed_ = false;
  uint64_t flushed_ = 0;    // bytes handed to writeback
  uint64_t unflushed_ = 0;  // bytes written since
};

}  // namespace torchbridge::checkpoint

#pragma once
// Asks the OS, independently of AtomicFile, whether a checkpoint saved in `directory` can be written
// unnamed: O_TMPFILE works there, and /proc/self/fd is there to name the file at commit.

#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace torchbridge::test_support {

inline bool unnamed_files_work_in(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return ::access("/proc/self/fd", X_OK) == 0;
}

}  // namespace torchbridge::test_support

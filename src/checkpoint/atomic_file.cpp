#include "checkpoint/atomic_file.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace torchbridge::checkpoint {

AtomicFile::AtomicFile(const std::string& target) : target_(target) {
  const auto slash = target.find_last_of('/');
  directory_ = slash == std::string::npos ? "." : target.substr(0, slash);
  std::string pattern = target + ".tmp-XXXXXX";
  fd_ = mkstemp(pattern.data());
  TORCH_CHECK(fd_ >= 0, target, ": cannot create a temporary file next to it: ", std::strerror(errno));
  path_ = pattern;
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd_, p, bytes);
    if (written < 0 && errno == EINTR) continue;
    TORCH_CHECK(written > 0, target_, ": writing failed: ", std::strerror(errno));
    p += written;
    bytes -= static_cast<size_t>(written);
  }
}

void AtomicFile::commit() {
  TORCH_CHECK(::fsync(fd_) == 0, target_, ": fsync failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  // The rename is the commit point: before it the target is the old file, after it the new one.
  TORCH_CHECK(::rename(path_.c_str(), target_.c_str()) == 0, target_, ": rename failed: ", std::strerror(errno));
  committed_ = true;
  const int dir = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TORCH_CHECK(dir >= 0 && ::fsync(dir) == 0, target_, ": fsync of directory ", directory_, " failed: ",
              std::strerror(errno));
  ::close(dir);
}

}  // namespace torchbridge::checkpoint

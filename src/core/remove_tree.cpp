#include <torchbridge/remove_tree.h>

#include <c10/util/Exception.h>

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace torchbridge {
namespace {

// nftw's callback takes no context: the walk's state lives here, one walk per thread at a time.
struct Walk {
  std::uintmax_t removed = 0;
  int error = 0;
  std::string failed_path;
};
thread_local Walk* current_walk = nullptr;

int remove_entry(const char* path, const struct stat* /*unused*/, int /*unused*/, struct FTW* /*unused*/) {
  if (std::remove(path) != 0) {  // unlink for files and links, rmdir for (by now empty) directories
    current_walk->error = errno;
    current_walk->failed_path = path;
    return 1;  // stops the walk
  }
  ++current_walk->removed;
  return 0;
}

}  // namespace

std::uintmax_t remove_tree(const std::string& path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) {
    const int error = errno;
    TORCH_CHECK(error == ENOENT, "cannot remove ", path, ": ", std::strerror(error));
    return 0;
  }
  Walk walk;
  current_walk = &walk;
  // Children before their directory (FTW_DEPTH), links as links (FTW_PHYS), at most 64 open
  // directories at a time.
  const int result = ::nftw(path.c_str(), remove_entry, 64, FTW_DEPTH | FTW_PHYS);
  current_walk = nullptr;
  if (result == -1) TORCH_CHECK(false, "cannot remove ", path, ": ", std::strerror(errno));
  TORCH_CHECK(walk.error == 0, "cannot remove ", walk.failed_path, " (under ", path, "): ",
              std::strerror(walk.error));
  return walk.removed;
}

}  // namespace torchbridge

#include "temporary_directory.h"

#include <torchbridge/remove_tree.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <stdexcept>

namespace torchbridge::cli {

std::string create_temporary_directory(const std::string& name) {
  const char* tmpdir = std::getenv("TMPDIR");
  const bool from_environment = tmpdir != nullptr && *tmpdir != '\0';
  const std::string parent = from_environment ? tmpdir : "/tmp";
  std::string pattern = parent + "/" + name + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    const int error = errno;  // before anything else can change it
    throw std::runtime_error("cannot create a temporary directory in " + parent +
                             (from_environment ? " (TMPDIR)" : "") + ": " + std::strerror(error));
  }
  return pattern;
}

TemporaryDirectory::~TemporaryDirectory() {
  try {
    remove_tree(path_);
  } catch (const std::exception& error) {
    std::cerr << "warning: the temporary directory " << path_ << " was left behind: " << error.what() << "\n";
  }
}

}  // namespace torchbridge::cli

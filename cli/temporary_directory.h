#pragma once
// Directories of the CLI's own under $TMPDIR (else /tmp): the portability run's output when no
// --output is given, the checkpoint benchmark's files, doctor's compiler probe. mkdtemp makes
// each unique, so two runs at once never share one.

#include <string>

namespace torchbridge::cli {

// Creates <$TMPDIR or /tmp>/<name>-XXXXXX and returns its path. Raises std::runtime_error naming
// the directory it was asked for in, TMPDIR when that chose it, and the operating system's reason.
std::string create_temporary_directory(const std::string& name);

// A temporary directory removed, with everything in it, when this object ends (also on an error).
// A removal that fails is a warning on stderr: a destructor must not throw, and the command's own
// result stands.
class TemporaryDirectory {
 public:
  explicit TemporaryDirectory(const std::string& name) : path_(create_temporary_directory(name)) {}
  ~TemporaryDirectory();
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& file_name) const { return path_ + "/" + file_name; }

 private:
  std::string path_;
};

}  // namespace torchbridge::cli

// AtomicFile (the checkpoint writer's temporary file): where the filesystem offers O_TMPFILE, the
// data being written has no name in the directory until commit, so a process killed mid-save
// (which cannot clean up) leaves nothing behind; committed, the target holds exactly the bytes.
#include "checkpoint/atomic_file.h"

#include <torchbridge/remove_tree.h>

#include <gtest/gtest.h>

#include "unnamed_files.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

namespace torchbridge::checkpoint {
namespace {

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = ::testing::TempDir() + "atomic_file_" + std::to_string(::getpid());
    remove_tree(directory_);
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { remove_tree(directory_); }

  // The OS is the reference: can an unnamed file be made in this directory at all?
  bool filesystem_has_o_tmpfile() const { return test_support::unnamed_files_work_in(directory_); }

  std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(directory_)) names.insert(entry.path().filename());
    return names;
  }

  std::string read(const std::string& name) const {
    std::ifstream in(directory_ + "/" + name, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  std::string directory_;
};

TEST_F(AtomicFileTest, DataBeingWrittenHasNoNameUntilCommit) {
  const bool supported = filesystem_has_o_tmpfile();
  AtomicFile file(directory_ + "/model.safetensors");
  EXPECT_EQ(file.unnamed(), supported) << "O_TMPFILE is " << (supported ? "" : "not ") << "available in " << directory_;
  file.write("0123456789", 10);
  if (supported) EXPECT_TRUE(entries().empty()) << "a kill here would leave " << *entries().begin();
  else EXPECT_EQ(entries().size(), 1u) << "the named temporary of a filesystem without O_TMPFILE";
  file.commit();
  EXPECT_EQ(entries(), std::set<std::string>{"model.safetensors"});
  EXPECT_EQ(read("model.safetensors"), "0123456789");
}

TEST_F(AtomicFileTest, ReplacesTheTargetAndLeavesNoTemporary) {
  { std::ofstream(directory_ + "/model.safetensors") << "old"; }
  AtomicFile file(directory_ + "/model.safetensors");
  file.write("new", 3);
  EXPECT_EQ(read("model.safetensors"), "old") << "the target must not change before commit";
  file.commit();
  EXPECT_EQ(entries(), std::set<std::string>{"model.safetensors"});
  EXPECT_EQ(read("model.safetensors"), "new");
}

TEST_F(AtomicFileTest, UncommittedLeavesTheOldFileAndNothingElse) {
  { std::ofstream(directory_ + "/model.safetensors") << "old"; }
  {
    AtomicFile file(directory_ + "/model.safetensors");
    file.write("half", 4);
  }  // destroyed uncommitted, as when a save throws
  EXPECT_EQ(entries(), std::set<std::string>{"model.safetensors"});
  EXPECT_EQ(read("model.safetensors"), "old");
}

// A name left by an earlier process with this one's PID (the kill window between naming and rename)
// does not stop the commit: the next free name is taken.
TEST_F(AtomicFileTest, CommitsPastAStaleTemporaryNameOfThisPid) {
  if (!filesystem_has_o_tmpfile()) GTEST_SKIP() << "names are chosen by mkstemp without O_TMPFILE";
  const std::string stale = "model.safetensors.tmp-" + std::to_string(::getpid()) + "-0";
  { std::ofstream(directory_ + "/" + stale) << "stale"; }
  AtomicFile file(directory_ + "/model.safetensors");
  file.write("new", 3);
  file.commit();
  EXPECT_EQ(entries(), (std::set<std::string>{"model.safetensors", stale}));
  EXPECT_EQ(read("model.safetensors"), "new");
}

}  // namespace
}  // namespace torchbridge::checkpoint

// remove_tree, the project's replacement for std::filesystem::remove_all (see remove_tree.h):
// checked against the operating system, which says what exists before and after.
#include <torchbridge/remove_tree.h>

#include <gtest/gtest.h>

#include "expect_error.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace torchbridge {
namespace {

bool exists_as_is(const std::string& path) {  // lstat: a dangling link still exists
  struct stat status {};
  return ::lstat(path.c_str(), &status) == 0;
}

class RemoveTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "remove_tree_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { remove_tree(root_); }
  void write(const std::string& path) { std::ofstream(path) << "bytes"; }
  std::string root_;
};

TEST_F(RemoveTree, RemovesEveryEntryOfANestedDirectoryAndCountsThem) {
  const std::string tree = root_ + "/tree";
  std::filesystem::create_directories(tree + "/a/b/c");
  std::filesystem::create_directories(tree + "/empty");
  write(tree + "/top");
  write(tree + "/a/one");
  write(tree + "/a/b/c/deep");
  // tree, a, b, c, empty (5 directories) and 3 files
  EXPECT_EQ(remove_tree(tree), 8u);
  EXPECT_FALSE(exists_as_is(tree));
  EXPECT_TRUE(exists_as_is(root_));
}

TEST_F(RemoveTree, RemovesLinksWithoutFollowingThem) {
  const std::string outside = root_ + "/outside", tree = root_ + "/tree";
  std::filesystem::create_directories(outside);
  write(outside + "/kept");
  std::filesystem::create_directories(tree);
  std::filesystem::create_directory_symlink(outside, tree + "/to_outside");
  std::filesystem::create_symlink(root_ + "/nowhere", tree + "/dangling");
  EXPECT_EQ(remove_tree(tree), 3u);
  EXPECT_FALSE(exists_as_is(tree));
  EXPECT_TRUE(exists_as_is(outside + "/kept"));
}

TEST_F(RemoveTree, TakesAFileOrALinkOnItsOwn) {
  write(root_ + "/file");
  std::filesystem::create_directory_symlink(root_, root_ + "/link_to_root");
  EXPECT_EQ(remove_tree(root_ + "/file"), 1u);
  EXPECT_EQ(remove_tree(root_ + "/link_to_root"), 1u);  // the link, not the directory it names
  EXPECT_FALSE(exists_as_is(root_ + "/file"));
  EXPECT_TRUE(exists_as_is(root_));
}

TEST_F(RemoveTree, AMissingPathRemovesNothing) { EXPECT_EQ(remove_tree(root_ + "/missing"), 0u); }

TEST_F(RemoveTree, AnImpossiblePathIsAnErrorNamingItAndTheReason) {
  write(root_ + "/file");
  test_support::expect_error([&] { remove_tree(root_ + "/file/child"); },
                             "cannot remove " + root_ + "/file/child: Not a directory");
  EXPECT_TRUE(exists_as_is(root_ + "/file"));
}

}  // namespace
}  // namespace torchbridge

// A checkpoint being rewritten is killed with SIGKILL at random points; after every kill the file
// must still open, validate, and hold one complete version (never a mix or a torn write). A sharded
// checkpoint is killed at every rename its save makes: no kill may lose the earlier checkpoint.
#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/remove_tree.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "unnamed_files.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

TEST(CheckpointCrashSafety, SurvivesFiftyKillsAtRandomPoints) {
  // A directory of its own, removed at the end: on a filesystem without O_TMPFILE every writer
  // killed mid-save leaves its 4 MiB temporary behind (a SIGKILLed process cannot clean up).
  const std::filesystem::path directory = ::testing::TempDir() + "crash_safety_" + std::to_string(::getpid());
  std::filesystem::create_directories(directory);
  const std::string path = (directory / "checkpoint.safetensors").string();
  // The kill window spans several saves however fast this machine saves right now.
  const auto start = std::chrono::steady_clock::now();
  save(path, {{"x", at::full({1 << 20}, 0.0f)}}, {{"version", "0"}});
  const auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  std::mt19937 random(12345);
  std::uniform_int_distribution<int64_t> delay_us(0, 8 * std::max<int64_t>(save_us.count(), 1000));
  int last_version = 0;
  std::set<int> versions_seen;
  for (int kill_number = 0; kill_number < 50; ++kill_number) {
    int ready_pipe[2];
    ASSERT_EQ(pipe(ready_pipe), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      dup2(ready_pipe[1], STDOUT_FILENO);
      close(ready_pipe[0]);
      execl(TORCHBRIDGE_WRITER_LOOP_PATH, TORCHBRIDGE_WRITER_LOOP_PATH, path.c_str(), nullptr);
      _exit(127);
    }
    close(ready_pipe[1]);
    char ready[6] = {};
    ASSERT_EQ(read(ready_pipe[0], ready, 5), 5) << "the writer did not start";
    close(ready_pipe[0]);
    usleep(delay_us(random));  // lands anywhere in the following saves
    ASSERT_EQ(kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer must have been killed, not have exited";

    const auto file = SafetensorsFile::open(path);  // validates header, offsets and sizes
    const int version = std::stoi(file.metadata().at("version"));
    const at::Tensor x = file.load("x");
    EXPECT_TRUE(at::all(x == float(version)).item<bool>()) << "kill " << kill_number << " left a torn version "
                                                            << version;
    last_version = std::max(last_version, version);
    versions_seen.insert(version);
  }
  EXPECT_GT(last_version, 0) << "the writer never completed a save; the kills came too early to test anything";
  // Kills landing after different numbers of saves show they hit different phases of a save.
  EXPECT_GE(versions_seen.size(), 3u) << "the kills always landed at the same point";
  // With O_TMPFILE the data is unnamed until the last microseconds of a save (naming, then rename),
  // so kills leave (almost) nothing; with named temporaries about a quarter of them left one.
  if (test_support::unnamed_files_work_in(directory)) {
    int leftovers = 0;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
      leftovers += entry.path().filename() != "checkpoint.safetensors";
    }
    EXPECT_LE(leftovers, 2) << "killed writers left temporary files beside the checkpoint";
  }
  remove_tree(directory);
}

// The version every tensor of the checkpoint in `directory` holds; fails the test on a mix.
float version_of(const std::string& directory) {
  const Checkpoint checkpoint = Checkpoint::open(directory);
  const at::Tensor first = checkpoint.load(checkpoint.names().front());
  for (const auto& name : checkpoint.names()) {
    EXPECT_TRUE(at::equal(checkpoint.load(name), first)) << "tensor " << name << " is of another version";
  }
  return first[0].item<float>();
}

// Runs checkpoint_writer_loop --sharded DIRECTORY VERSION with the rename shim killing it at its
// `kill_at`th rename; true when it was killed, false when it finished first.
bool save_sharded_killed_at_rename(const std::string& directory, int version, int kill_at) {
  const pid_t child = fork();
  if (child == 0) {
    ::setenv("LD_PRELOAD", TORCHBRIDGE_KILL_AT_RENAME_PATH, 1);
    ::setenv("TORCHBRIDGE_KILL_AT_RENAME", std::to_string(kill_at).c_str(), 1);
    const std::string version_text = std::to_string(version);
    execl(TORCHBRIDGE_WRITER_LOOP_PATH, TORCHBRIDGE_WRITER_LOOP_PATH, "--sharded", directory.c_str(),
          version_text.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  if (WIFSIGNALED(status)) {
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    return true;
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the writer failed, status " << status;
  return false;
}

TEST(CheckpointCrashSafety, AShardedSaveKilledAtAnyRenameLeavesAWholeCheckpoint) {
  const std::string directory = ::testing::TempDir() + "sharded_crash_" + std::to_string(::getpid());
  std::vector<std::pair<std::string, at::Tensor>> first_version;
  for (int i = 0; i < 6; ++i) first_version.emplace_back("t" + std::to_string(i), at::full({256}, 1.0f));
  int kills = 0, set_aside = 0;
  for (int kill_at = 1;; ++kill_at) {
    remove_tree(directory);
    std::filesystem::create_directories(directory);
    save_sharded(directory, first_version, /*max_shard_bytes=*/1024);
    if (!save_sharded_killed_at_rename(directory, 2, kill_at)) {
      EXPECT_EQ(version_of(directory), 2.0f) << "the save that finished";
      break;
    }
    ++kills;
    try {
      const float version = version_of(directory);
      EXPECT_TRUE(version == 1.0f || version == 2.0f) << "kill at rename " << kill_at;
      continue;
    } catch (const c10::Error& e) {
      // Killed while publishing: the directory has no checkpoint, and says where the earlier one is.
      const std::string message = e.msg();
      EXPECT_NE(message.find("a save into it was interrupted"), std::string::npos) << message;
      ++set_aside;
    }
    // Putting the set-aside files back gives the earlier checkpoint whole.
    int previous_directories = 0;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
      if (entry.path().filename().string().rfind(".torchbridge-previous-", 0) != 0) continue;
      ++previous_directories;
      for (const auto& file : std::filesystem::directory_iterator(entry.path())) {
        std::filesystem::rename(file.path(), directory + "/" + file.path().filename().string());
      }
    }
    EXPECT_EQ(previous_directories, 1) << "kill at rename " << kill_at;
    EXPECT_EQ(version_of(directory), 1.0f) << "kill at rename " << kill_at << ": the earlier checkpoint, put back";
  }
  // Six shards and the index are written (one rename each), the earlier seven set aside, the new
  // seven moved in: every one of those is a kill point, and those while publishing need the advice.
  EXPECT_GE(kills, 20);
  EXPECT_GE(set_aside, 7);
  remove_tree(directory);
}

}  // namespace
}  // namespace torchbridge::checkpoint

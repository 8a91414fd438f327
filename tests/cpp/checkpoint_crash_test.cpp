// A checkpoint being rewritten is killed with SIGKILL at random points; after every kill the file
// must still open, validate, and hold one complete version (never a mix or a torn write).
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

}  // namespace
}  // namespace torchbridge::checkpoint

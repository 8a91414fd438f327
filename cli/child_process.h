#pragma once
// Running part of a command in a child process of the same tool. PyTorch serves one accelerator
// per process for autograd (include/torchbridge/one_accelerator.h), so `validate` and
// `portability` check an SDK device in a child when the parent uses CUDA (or when asked to
// isolate every backend, so one that crashes cannot take the report down with it).

#include <string>
#include <vector>

namespace torchbridge::cli {

// How to start this tool again: {"/proc/self/exe"} for the C++ binary; the Python package's
// console script sets {python, "-m", "torchbridge.cli"}, since there /proc/self/exe is Python.
void set_self_invocation(std::vector<std::string> prefix);
const std::vector<std::string>& self_invocation();

struct ChildResult {
  int exit_code = -1;    // when it exited
  int signal = 0;        // when a signal ended it
  std::string out, err;  // everything it wrote
  // "exited with code 1", "was killed by signal 11 (Segmentation fault)".
  std::string describe_exit() const;
  // The last non-empty line of stderr, or "" (the error a failing child printed).
  std::string last_error_line() const;
};

// Runs self_invocation() + `args` with this process's environment plus `extra_env`
// ("NAME=value" entries, overriding), capturing stdout and stderr; waits for it to end.
ChildResult run_self(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {});

// Runs `argv` (argv[0] a path, or a name looked up on PATH) the same way. Throws std::runtime_error
// naming the program when it cannot be started (not found, not executable).
ChildResult run_program(std::vector<std::string> argv, const std::vector<std::string>& extra_env = {});

}  // namespace torchbridge::cli

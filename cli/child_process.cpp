#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

extern char** environ;

namespace torchbridge::cli {
namespace {

std::vector<std::string>& invocation() {
  static std::vector<std::string> prefix = {"/proc/self/exe"};
  return prefix;
}

// Closes both ends of a pipe on scope exit unless released.
struct Pipe {
  std::array<int, 2> fd{-1, -1};
  Pipe() {
    if (pipe2(fd.data(), O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  ~Pipe() {
    for (int f : fd) {
      if (f >= 0) close(f);
    }
  }
  void close_end(int end) {
    close(fd[end]);
    fd[end] = -1;
  }
};

// Reads both streams until the child closes them; poll() so that a child filling one pipe while
// we wait on the other cannot deadlock.
void drain(int out_fd, int err_fd, std::string& out, std::string& err) {
  std::array<pollfd, 2> fds{pollfd{out_fd, POLLIN, 0}, pollfd{err_fd, POLLIN, 0}};
  std::array<std::string*, 2> sinks{&out, &err};
  int open_streams = 2;
  char buffer[65536];
  while (open_streams > 0) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;  // end of stream (or an error that ends it)
        --open_streams;
      }
    }
  }
}

}  // namespace

void set_self_invocation(std::vector<std::string> prefix) {
  if (prefix.empty()) throw std::invalid_argument("set_self_invocation: the command is empty");
  invocation() = std::move(prefix);
}

const std::vector<std::string>& self_invocation() { return invocation(); }

std::string ChildResult::describe_exit() const {
  if (signal != 0) return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exited with code " + std::to_string(exit_code);
}

std::string ChildResult::last_error_line() const {
  size_t end = err.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t start = err.find_last_of('\n', end);
  return err.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
}

ChildResult run_self(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv_text = self_invocation();
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  return run_program(std::move(argv_text), extra_env);
}

ChildResult run_program(std::vector<std::string> argv_text, const std::vector<std::string>& extra_env) {
  if (argv_text.empty()) throw std::invalid_argument("run_program: the command is empty");
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_text = extra_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& extra : extra_env) overridden = overridden || extra.substr(0, extra.find('=')) == name;
    if (!overridden) env_text.push_back(entry);
  }
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);

  Pipe out, err;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out.fd[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err.fd[1], STDERR_FILENO);
  pid_t pid = 0;
  // posix_spawnp: a bare name is looked up on PATH (a compiler), a path is used as it is (this tool).
  const int spawn_error = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0) {
    throw std::runtime_error("cannot start " + argv_text[0] + ": " + std::strerror(spawn_error));
  }
  out.close_end(1);
  err.close_end(1);

  ChildResult result;
  drain(out.fd[0], err.fd[0], result.out, result.err);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace torchbridge::cli

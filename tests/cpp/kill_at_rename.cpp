// Preloaded (LD_PRELOAD) into a checkpoint writer by the crash-safety test: the process kills
// itself with SIGKILL at its Nth call of rename() (N from TORCHBRIDGE_KILL_AT_RENAME), so the test
// can stop a multi-file save at every step that changes which files the directory holds.
#include <dlfcn.h>

#include <csignal>
#include <cstdlib>

extern "C" int rename(const char* from, const char* to) {
  using Rename = int (*)(const char*, const char*);
  static const auto real = reinterpret_cast<Rename>(dlsym(RTLD_NEXT, "rename"));
  static const char* const limit = std::getenv("TORCHBRIDGE_KILL_AT_RENAME");
  static int calls = 0;
  if (limit != nullptr && ++calls == std::atoi(limit)) std::raise(SIGKILL);
  return real(from, to);
}

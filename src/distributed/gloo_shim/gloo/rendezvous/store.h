#pragma once
// Stand-in for Gloo's rendezvous/store.h (see ../README.md). ProcessGroupGloo.hpp derives its
// GlooStore from this interface; only libtorch constructs one, so only the members GlooStore
// overrides need to be declared for the header to compile.

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace gloo::rendezvous

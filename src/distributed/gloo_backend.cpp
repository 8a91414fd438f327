#include "distributed/collective_backends.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <memory>
#include <vector>

namespace torchbridge::distributed {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // As torch.distributed does: GLOO_SOCKET_IFNAME when set, else this host's name (or loopback).
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

}  // namespace torchbridge::distributed

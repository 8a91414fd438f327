#pragma once
// The one place each of torch's collective backends is constructed (internal):
//   gloo_backend.cpp  ProcessGroupGloo, compiled against the declarations in gloo_shim/, since
//                     torch ships no Gloo headers;
//   nccl_backend.cpp  ProcessGroupNCCL, on a CUDA build of torch whose NCCL headers were found at
//                     build time; elsewhere it raises saying which of the two is missing.

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace torchbridge::distributed {

// Connects to the other ranks through `store` (blocking, up to `timeout`); collectives on the
// result wait at most `timeout` too.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout);

// NCCL communicators for `rank` of `world_size` on `device` (this rank's GPU, which becomes the
// current CUDA device), meeting through `store`; collectives wait at most `timeout`. Raises
// c10::ValueError with nccl_unavailable_reason() where NCCL cannot run, or when `device` is not
// a GPU of this machine.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout,
                                                    c10::Device device);

}  // namespace torchbridge::distributed

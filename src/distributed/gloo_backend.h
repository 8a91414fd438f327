#pragma once
// The one place that constructs torch's Gloo backend (gloo_backend.cpp compiles against the
// declarations in gloo_shim/, since torch ships no Gloo headers). Internal.

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

}  // namespace torchbridge::distributed

// "Pinned" host memory. The emulator's transfers are CPU memcpy calls in this very address space,
// so there is no DMA engine that needs pages locked: pageable memory is just as valid a source or
// destination. mlock would add nothing but a failure mode (RLIMIT_MEMLOCK is often 8 MiB in
// containers). Allocations are page-aligned, like the pinned memory of real drivers, and
// remembered, so freeing a pointer this runtime did not hand out is reported, not executed.
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_set>

namespace torchbridge::emu {

class HostAllocations {
 public:
  // nullptr when the host is out of memory. `bytes` must be > 0.
  void* allocate(std::size_t bytes);
  // False (and nothing freed) for a pointer that is not a live allocation of this runtime.
  bool release(void* pointer);

 private:
  std::mutex mutex_;
  std::unordered_set<void*> live_;
};

}  // namespace torchbridge::emu

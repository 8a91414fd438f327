#include "host_allocations.h"

#include <unistd.h>

#include <cstdlib>

namespace torchbridge::emu {

void* HostAllocations::allocate(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > static_cast<std::size_t>(-1) - page) return nullptr;
  // aligned_alloc wants a size that is a multiple of the alignment.
  void* pointer = std::aligned_alloc(page, (bytes + page - 1) / page * page);
  if (pointer == nullptr) return nullptr;
  try {
    std::lock_guard lock(mutex_);
    live_.insert(pointer);
  } catch (...) {  // the bookkeeping itself ran out of memory: do not leak the block
    std::free(pointer);
    return nullptr;
  }
  return pointer;
}

bool HostAllocations::release(void* pointer) {
  {
    std::lock_guard lock(mutex_);
    if (live_.erase(pointer) == 0) return false;
  }
  std::free(pointer);
  return true;
}

}  // namespace torchbridge::emu

#pragma once
// Pinned host memory from the vendor runtime. A block freed while a non_blocking copy may still
// read or write it is returned to the runtime only after that copy's stream has passed it.

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Stream.h>

namespace torchbridge::sdk {

// Also torch's host allocator for the device type (at::getHostAllocator(PrivateUse1)), which
// torch.accelerator.empty_host_cache() calls: unregistered, that call read a null pointer.
class HostAllocator : public at::HostAllocator {
 public:
  virtual bool is_pinned(const void* pointer) = 0;
  // Keeps the block containing `pointer` alive until work queued on `stream` so far completes.
  virtual void record_use(const void* pointer, const c10::Stream& stream) = 0;
};

HostAllocator& host_allocator();

// Makes host_allocator() torch's host allocator for PrivateUse1.
void register_host_allocator();

}  // namespace torchbridge::sdk

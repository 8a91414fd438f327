// Best-fit allocation of byte ranges inside one device's capacity, with coalescing of free
// neighbours. Works on offsets only (no memory is touched) and is not thread-safe: the owning
// device serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace torchbridge::emu {

class RangeAllocator {
 public:
  // Every allocation starts on, and is sized in, multiples of this: the alignment CUDA's allocator
  // guarantees, which vectorised kernels and TorchBridge's caching allocator may rely on.
  static constexpr std::uint64_t kAlignment = 256;

  explicit RangeAllocator(std::uint64_t capacity);

  // Offset of a new range of at least `bytes` (> 0), or nullopt when no free range fits.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);

  // Ends the allocation that starts at `offset`. With `return_to_pool` false the range is
  // forgotten but never reused (the "leak" fault). False if no live allocation starts there.
  bool release(std::uint64_t offset, bool return_to_pool);

  // True when [offset, offset + bytes) lies inside the requested bytes of one live allocation.
  bool contains_live_range(std::uint64_t offset, std::uint64_t bytes) const;

  // Bytes in free ranges: capacity minus the (rounded-up) size of live and leaked allocations.
  std::uint64_t free_bytes() const { return free_bytes_; }
  std::uint64_t largest_free_range() const;

 private:
  struct LiveAllocation {
    std::uint64_t reserved;   // rounded up to kAlignment; what the pool lost
    std::uint64_t requested;  // what the caller asked for; the valid range for copies
  };

  void add_free_range(std::uint64_t offset, std::uint64_t size);
  void remove_free_range(std::map<std::uint64_t, std::uint64_t>::iterator range);

  // The same free ranges indexed two ways: by offset to find neighbours when coalescing, by
  // (size, offset) to find the smallest range that fits.
  std::map<std::uint64_t, std::uint64_t> free_by_offset_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size_;
  std::map<std::uint64_t, LiveAllocation> live_;
  std::uint64_t free_bytes_ = 0;
};

}  // namespace torchbridge::emu

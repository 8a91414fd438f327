#include "range_allocator.h"

#include <iterator>

namespace torchbridge::emu {

RangeAllocator::RangeAllocator(std::uint64_t capacity) {
  if (capacity > 0) add_free_range(0, capacity);
}

std::optional<std::uint64_t> RangeAllocator::allocate(std::uint64_t bytes) {
  if (bytes == 0 || bytes > free_bytes_) return std::nullopt;  // also keeps the rounding below from overflowing
  const std::uint64_t reserved = (bytes + kAlignment - 1) / kAlignment * kAlignment;

  // Best fit: the smallest free range that holds `reserved`, lowest offset among equals.
  auto fit = free_by_size_.lower_bound({reserved, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const auto [range_size, offset] = *fit;
  remove_free_range(free_by_offset_.find(offset));
  if (range_size > reserved) add_free_range(offset + reserved, range_size - reserved);

  live_.emplace(offset, LiveAllocation{reserved, bytes});
  return offset;
}

bool RangeAllocator::release(std::uint64_t offset, bool return_to_pool) {
  const auto live = live_.find(offset);
  if (live == live_.end()) return false;
  std::uint64_t start = offset;
  std::uint64_t size = live->second.reserved;
  live_.erase(live);
  if (!return_to_pool) return true;

  // Merge with the free neighbours on both sides so large allocations stay possible after churn.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    next = std::next(next);
    remove_free_range(std::prev(next));
  }
  if (next != free_by_offset_.begin()) {
    const auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      size += previous->second;
      remove_free_range(previous);
    }
  }
  add_free_range(start, size);
  return true;
}

bool RangeAllocator::contains_live_range(std::uint64_t offset, std::uint64_t bytes) const {
  auto after = live_.upper_bound(offset);
  if (after == live_.begin()) return false;
  const auto& [start, allocation] = *std::prev(after);
  const std::uint64_t into = offset - start;  // offset >= start by construction
  return into < allocation.requested && bytes <= allocation.requested - into;
}

std::uint64_t RangeAllocator::largest_free_range() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void RangeAllocator::add_free_range(std::uint64_t offset, std::uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void RangeAllocator::remove_free_range(std::map<std::uint64_t, std::uint64_t>::iterator range) {
  free_by_size_.erase({range->second, range->first});
  free_bytes_ -= range->second;
  free_by_offset_.erase(range);
}

}  // namespace torchbridge::emu

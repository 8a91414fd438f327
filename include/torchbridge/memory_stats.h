#pragma once
// Memory counters for one device. Each field is either a real reading from `source` or empty:
// a backend whose allocator does not track a quantity leaves it empty rather than inventing it.

#include <cstdint>
#include <optional>
#include <string>

namespace torchbridge {

struct MemoryStats {
  std::optional<int64_t> allocated_bytes;       // bytes in live tensors (CPU: process RSS)
  std::optional<int64_t> reserved_bytes;        // bytes held by the caching allocator
  std::optional<int64_t> active_bytes;          // allocated plus blocks awaiting stream sync
  std::optional<int64_t> peak_allocated_bytes;  // since start or the last reset (CPU: VmHWM)
  std::optional<int64_t> peak_reserved_bytes;
  std::optional<int64_t> free_bytes;   // free on the device (CPU: MemAvailable)
  std::optional<int64_t> total_bytes;  // device capacity (CPU: MemTotal)
  std::optional<int64_t> allocation_count;     // allocations served since start
  std::optional<int64_t> out_of_memory_count;  // allocations that failed with OOM
  std::string source;  // where the numbers come from, e.g. "torch DeviceAllocator (CUDA)"
};

}  // namespace torchbridge

// One emulated device: its memory (DeviceMemory) plus the allocator that carves it up, behind a
// mutex so allocation, freeing and pointer validation may come from any thread.
#pragma once

#include "device_memory.h"
#include "range_allocator.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace torchbridge::emu {

class EmuDevice {
 public:
  static std::unique_ptr<EmuDevice> create(int index, std::uint64_t capacity, bool guarded, std::string& error);

  int index() const { return index_; }
  const DeviceMemory& memory() const { return *memory_; }

  struct Allocation {
    void* pointer = nullptr;  // nullptr: did not fit; the numbers below describe why
    std::uint64_t free_bytes = 0;
    std::uint64_t largest_free_range = 0;
  };
  Allocation allocate(std::size_t bytes);

  // False when `pointer` is not the start of a live allocation of this device.
  bool release(const void* pointer, bool return_to_pool);

  // The shadow address of `pointer` when [pointer, pointer + bytes) lies inside one live
  // allocation of this device, else nullptr.
  std::byte* resolve(const void* pointer, std::size_t bytes) const;

  std::uint64_t free_bytes() const;

 private:
  EmuDevice(int index, std::unique_ptr<DeviceMemory> memory);

  int index_;
  std::unique_ptr<DeviceMemory> memory_;
  mutable std::mutex mutex_;  // guards allocator_
  RangeAllocator allocator_;
};

}  // namespace torchbridge::emu

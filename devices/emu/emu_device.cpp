#include "emu_device.h"

#include <optional>
#include <utility>

namespace torchbridge::emu {

std::unique_ptr<EmuDevice> EmuDevice::create(int index, std::uint64_t capacity, bool guarded, std::string& error) {
  auto memory = DeviceMemory::create(index, capacity, guarded, error);
  if (!memory) return nullptr;
  return std::unique_ptr<EmuDevice>(new EmuDevice(index, std::move(memory)));
}

EmuDevice::EmuDevice(int index, std::unique_ptr<DeviceMemory> memory)
    : index_(index), memory_(std::move(memory)), allocator_(memory_->capacity()) {}

EmuDevice::Allocation EmuDevice::allocate(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Allocation result;
  if (const auto offset = allocator_.allocate(bytes)) {
    result.pointer = memory_->device_address(*offset);
  }
  result.free_bytes = allocator_.free_bytes();
  result.largest_free_range = allocator_.largest_free_range();
  return result;
}

bool EmuDevice::release(const void* pointer, bool return_to_pool) {
  if (!memory_->contains(pointer)) return false;
  std::lock_guard lock(mutex_);
  return allocator_.release(memory_->offset_of(pointer), return_to_pool);
}

std::byte* EmuDevice::resolve(const void* pointer, std::size_t bytes) const {
  if (!memory_->contains(pointer)) return nullptr;
  const std::uint64_t offset = memory_->offset_of(pointer);
  std::lock_guard lock(mutex_);
  return allocator_.contains_live_range(offset, bytes) ? memory_->shadow_address(offset) : nullptr;
}

std::uint64_t EmuDevice::free_bytes() const {
  std::lock_guard lock(mutex_);
  return allocator_.free_bytes();
}

}  // namespace torchbridge::emu

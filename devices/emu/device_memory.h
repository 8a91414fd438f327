// The backing store of one emulated device: a sparse memfd of `capacity` bytes mapped twice.
//
//  - The *device view* provides the addresses handed out as device pointers. In guarded mode it is
//    PROT_NONE, so host code that dereferences a device pointer by mistake gets SIGSEGV at the
//    faulting line, just as it would on a discrete GPU, instead of silently working here.
//  - The *shadow view* is PROT_READ|PROT_WRITE over the same pages and is used only by the runtime
//    itself to carry out copies and memsets (translated by offset).
//
// In unguarded mode the device view *is* the read/write mapping, so device pointers are ordinary
// host memory (host_addressable = 1). The memfd is only ftruncate'd, so untouched capacity costs
// no RAM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace torchbridge::emu {

class DeviceMemory {
 public:
  // nullptr on failure, with `error` saying which system call failed and why.
  static std::unique_ptr<DeviceMemory> create(int device, std::uint64_t capacity, bool guarded, std::string& error);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  std::uint64_t capacity() const { return capacity_; }
  bool host_addressable() const { return !guarded_; }

  // True when any byte of [address, address + bytes) (at least one byte) lies in the device view.
  bool overlaps(const void* address, std::size_t bytes) const;
  bool contains(const void* address) const { return overlaps(address, 1); }

  std::uint64_t offset_of(const void* device_address) const {
    return reinterpret_cast<std::uintptr_t>(device_address) - reinterpret_cast<std::uintptr_t>(device_view_);
  }
  void* device_address(std::uint64_t offset) const { return device_view_ + offset; }
  // Where the runtime reads and writes the byte at `offset`.
  std::byte* shadow_address(std::uint64_t offset) const { return shadow_view_ + offset; }

 private:
  DeviceMemory(int fd, std::uint64_t capacity, bool guarded, std::byte* device_view, std::byte* shadow_view);

  int fd_;
  std::uint64_t capacity_;
  bool guarded_;
  std::byte* device_view_;
  std::byte* shadow_view_;  // equals device_view_ when unguarded
};

}  // namespace torchbridge::emu

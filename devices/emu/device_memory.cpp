#include "device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace torchbridge::emu {
namespace {

std::string system_error(const std::string& what, int device, std::uint64_t capacity) {
  return "emu device " + std::to_string(device) + ": " + what + " for " + std::to_string(capacity) +
         " bytes failed: " + std::strerror(errno);
}

}  // namespace

std::unique_ptr<DeviceMemory> DeviceMemory::create(int device, std::uint64_t capacity, bool guarded,
                                                   std::string& error) {
  const std::string name = "torchbridge-emu-device-" + std::to_string(device);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    error = system_error("memfd_create", device, capacity);
    return nullptr;
  }
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    error = system_error("ftruncate of the device memfd", device, capacity);
    close(fd);
    return nullptr;
  }
  void* shadow = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (shadow == MAP_FAILED) {
    error = system_error("mapping the device memory read/write", device, capacity);
    close(fd);
    return nullptr;
  }
  void* device_view = shadow;
  if (guarded) {
    device_view = mmap(nullptr, capacity, PROT_NONE, MAP_SHARED, fd, 0);
    if (device_view == MAP_FAILED) {
      error = system_error("mapping the guarded (PROT_NONE) device view", device, capacity);
      munmap(shadow, capacity);
      close(fd);
      return nullptr;
    }
  }
  return std::unique_ptr<DeviceMemory>(new DeviceMemory(fd, capacity, guarded, static_cast<std::byte*>(device_view),
                                                        static_cast<std::byte*>(shadow)));
}

DeviceMemory::DeviceMemory(int fd, std::uint64_t capacity, bool guarded, std::byte* device_view,
                           std::byte* shadow_view)
    : fd_(fd), capacity_(capacity), guarded_(guarded), device_view_(device_view), shadow_view_(shadow_view) {}

DeviceMemory::~DeviceMemory() {
  if (device_view_ != shadow_view_) munmap(device_view_, capacity_);
  munmap(shadow_view_, capacity_);
  close(fd_);
}

bool DeviceMemory::overlaps(const void* address, std::size_t bytes) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const auto view = reinterpret_cast<std::uintptr_t>(device_view_);
  const std::uint64_t length = bytes == 0 ? 1 : bytes;
  // [begin, begin + length) meets [view, view + capacity); written to avoid overflow at the top.
  return begin < view + capacity_ && (begin >= view || view - begin < length);
}

}  // namespace torchbridge::emu

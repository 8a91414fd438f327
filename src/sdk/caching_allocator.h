#pragma once
// The SDK device's caching allocator: a c10::DeviceAllocator over the vendor runtime's
// device_malloc/device_free, so at::accelerator's memory statistics, emptyCache and peaks are
// real for every SDK device. Internal to the SDK glue.

#include <c10/core/CachingDeviceAllocator.h>

#include <optional>

namespace torchbridge::sdk {

class CachingAllocator : public c10::DeviceAllocator {
 public:
  virtual void init(int device_count) = 0;
  // Device owning `pointer` (anywhere inside a live allocation), if any.
  virtual std::optional<c10::DeviceIndex> device_of(const void* pointer) = 0;
  // The per-process memory fraction (see set_memory_fraction in torchbridge/sdk/device.h).
  virtual void set_memory_fraction(double fraction, c10::DeviceIndex device) = 0;
  virtual double memory_fraction(c10::DeviceIndex device) = 0;
};

CachingAllocator& caching_allocator();

}  // namespace torchbridge::sdk

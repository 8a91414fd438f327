#pragma once
// Base for adapters of devices that PyTorch drives through c10's device-generic machinery
// (a registered DeviceGuardImpl and a c10::DeviceAllocator). It answers streams, events,
// synchronization and memory statistics once, so each vendor adapter only describes its devices.
// Internal to libtorchbridge.

#include <torchbridge/backend.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <utility>

namespace torchbridge {

class AcceleratorBackend : public Backend {
 public:
  explicit AcceleratorBackend(c10::DeviceType type) : type_(type) {}

  c10::DeviceType device_type() const override { return type_; }

  MemoryStats memory_stats(int index) const override;
  void reset_peak_memory_stats(int index) override;
  void empty_cache() override;
  void synchronize(int index) override;
  c10::Stream current_stream(int index) const override;
  c10::Stream new_stream(int index) const override;
  c10::Event new_event(bool enable_timing) const override;

 protected:
  // Raises unless available; then has torch initialise this device type once (lazily, as its
  // first tensor would), so allocator statistics and guards work before any tensor exists.
  void initialize() const;
  // The guard registered for this device type; raises when none is (backend not compiled in).
  const c10::impl::DeviceGuardImplInterface& guard() const;
  // The torch allocator for this device type; raises when it is not a DeviceAllocator.
  c10::DeviceAllocator& allocator() const;
  // Number of devices the registered guard reports; 0 when no guard is registered.
  int guard_device_count() const;
  // Free and total device memory from the allocator, when it can tell.
  std::optional<std::pair<size_t, size_t>> memory_info(int index) const;

 private:
  c10::DeviceType type_;
};

}  // namespace torchbridge

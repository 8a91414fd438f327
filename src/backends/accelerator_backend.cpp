#include "backends/accelerator_backend.h"

#include "core/devices_in_process.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <string>

namespace torchbridge {

void AcceleratorBackend::initialize() const {
  // Torch initialises a device type lazily, on its first tensor. Until then, e.g., CUDA's caching
  // allocator has no per-device state and answers statistics with "invalid device argument".
  // This sets up torch's state for the type without creating a context on any device.
  check_available();
  at::globalContext().lazyInitDevice(type_);
}

const c10::impl::DeviceGuardImplInterface& AcceleratorBackend::guard() const {
  initialize();
  TORCH_CHECK(c10::impl::hasDeviceGuardImpl(type_), "backend '", name(),
              "' has no device guard registered in this process: ", availability().reason);
  return *c10::impl::getDeviceGuardImpl(type_);
}

int AcceleratorBackend::guard_device_count() const { return detail::devices_in_process(type_).value_or(0); }

c10::DeviceAllocator& AcceleratorBackend::allocator() const {
  initialize();
  auto* device_allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(type_));
  TORCH_CHECK(device_allocator != nullptr, "backend '", name(),
              "': torch's allocator for this device type is not a c10::DeviceAllocator, so it "
              "exposes no memory statistics");
  return *device_allocator;
}

std::optional<std::pair<size_t, size_t>> AcceleratorBackend::memory_info(int index) const {
  try {
    return allocator().getMemoryInfo(static_cast<c10::DeviceIndex>(index));
  } catch (const c10::NotImplementedError&) {
    return std::nullopt;  // the allocator cannot tell; report the fields as unknown
  }
}

MemoryStats AcceleratorBackend::memory_stats(int index) const {
  check_device_index(index);
  const auto device_index = static_cast<c10::DeviceIndex>(index);
  const auto stats = allocator().getDeviceStats(device_index);
  constexpr size_t kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

  MemoryStats out;
  out.allocated_bytes = stats.allocated_bytes[kAggregate].current;
  out.peak_allocated_bytes = stats.allocated_bytes[kAggregate].peak;
  out.reserved_bytes = stats.reserved_bytes[kAggregate].current;
  out.peak_reserved_bytes = stats.reserved_bytes[kAggregate].peak;
  out.active_bytes = stats.active_bytes[kAggregate].current;
  out.allocation_count = stats.allocation[kAggregate].allocated;
  out.out_of_memory_count = stats.num_ooms;
  if (const auto info = memory_info(index)) {
    out.free_bytes = static_cast<int64_t>(info->first);
    out.total_bytes = static_cast<int64_t>(info->second);
  }
  out.source = "torch DeviceAllocator (" + c10::DeviceTypeName(device_type(), true) + ")";
  return out;
}

void AcceleratorBackend::reset_peak_memory_stats(int index) {
  check_device_index(index);
  allocator().resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

void AcceleratorBackend::empty_cache() {
  check_available();
  allocator().emptyCache();
}

void AcceleratorBackend::synchronize(int index) {
  check_device_index(index);
  guard().synchronizeDevice(static_cast<c10::DeviceIndex>(index));
}

c10::Stream AcceleratorBackend::current_stream(int index) const {
  return guard().getStream(device(index));
}

c10::Stream AcceleratorBackend::new_stream(int index) const {
  return guard().getNewStream(device(index));
}

c10::Event AcceleratorBackend::new_event(bool enable_timing) const {
  check_available();
  return c10::Event(device_type(), enable_timing ? c10::EventFlag::BACKEND_DEFAULT
                                                 : c10::EventFlag::PYTORCH_DEFAULT);
}

}  // namespace torchbridge

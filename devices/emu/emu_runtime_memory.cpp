// EmuRuntime: device and host allocation, and the validation and execution of copies and fills.
#include "emu_runtime.h"

#include "last_error.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::emu {
namespace {

std::string range_text(const void* pointer, size_t bytes) {
  return pointer_text(pointer) + " (" + std::to_string(bytes) + " bytes)";
}

bool is_valid_kind(int kind) {
  return kind == TB_MEMCPY_HOST_TO_DEVICE || kind == TB_MEMCPY_DEVICE_TO_HOST || kind == TB_MEMCPY_DEVICE_TO_DEVICE;
}

}  // namespace

tb_status EmuRuntime::device_malloc(int32_t device, size_t bytes, void** pointer) {
  if (const tb_status status = check_device("device_malloc", device); status != TB_SUCCESS) return status;
  if (pointer == nullptr) return fail(TB_ERROR_INVALID_VALUE, "device_malloc: pointer is NULL");
  if (bytes == 0) {  // like cudaMalloc(0): nothing to hand out, and not an error
    *pointer = nullptr;
    return TB_SUCCESS;
  }
  EmuDevice& emu_device = *devices_[static_cast<std::size_t>(device)];
  const EmuDevice::Allocation allocation = emu_device.allocate(bytes);
  if (allocation.pointer == nullptr) {
    const std::uint64_t capacity = emu_device.memory().capacity();
    std::string message = "out of memory on emu device " + std::to_string(device) + ": requested " +
                          std::to_string(bytes) + " bytes, " + std::to_string(allocation.free_bytes) +
                          " bytes free of " + std::to_string(capacity);
    if (allocation.free_bytes >= bytes) {  // enough in total, but not in one piece
      message += " (largest free block " + std::to_string(allocation.largest_free_range) +
                 " bytes; allocations are rounded up to multiples of " +
                 std::to_string(RangeAllocator::kAlignment) + ")";
    }
    return fail(TB_ERROR_OUT_OF_MEMORY, std::move(message));
  }
  *pointer = allocation.pointer;
  return TB_SUCCESS;
}

tb_status EmuRuntime::device_free(int32_t device, void* pointer) {
  if (const tb_status status = check_device("device_free", device); status != TB_SUCCESS) return status;
  if (pointer == nullptr) return TB_SUCCESS;  // like free(NULL)
  if (devices_[static_cast<std::size_t>(device)]->release(pointer, faults_.freed_memory_returns_to_pool())) {
    return TB_SUCCESS;
  }
  std::string message = "device_free: " + pointer_text(pointer) + " is not a live allocation of emu device " +
                        std::to_string(device);
  const EmuDevice* owner = device_containing(pointer);
  if (owner != nullptr && owner->index() != device) {
    message += "; it lies in the memory of emu device " + std::to_string(owner->index());
  } else if (owner != nullptr) {
    message += " (already freed, or not the start of an allocation)";
  } else {
    message += " (this runtime never handed it out)";
  }
  return fail(TB_ERROR_INVALID_POINTER, std::move(message));
}

tb_status EmuRuntime::host_malloc(size_t bytes, void** pointer) {
  if (pointer == nullptr) return fail(TB_ERROR_INVALID_VALUE, "host_malloc: pointer is NULL");
  if (bytes == 0) {
    *pointer = nullptr;
    return TB_SUCCESS;
  }
  void* allocation = host_allocations_.allocate(bytes);
  if (allocation == nullptr) {
    return fail(TB_ERROR_OUT_OF_MEMORY, "host_malloc: the host could not provide " + std::to_string(bytes) + " bytes");
  }
  *pointer = allocation;
  return TB_SUCCESS;
}

tb_status EmuRuntime::host_free(void* pointer) {
  if (pointer == nullptr) return TB_SUCCESS;
  if (host_allocations_.release(pointer)) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_POINTER, "host_free: " + pointer_text(pointer) +
                                            " is not live pinned host memory of this runtime (never "
                                            "returned by host_malloc, or already freed)");
}

const EmuDevice* EmuRuntime::device_containing(const void* pointer) const {
  for (const auto& device : devices_) {
    if (device->memory().contains(pointer)) return device.get();
  }
  return nullptr;
}

tb_status EmuRuntime::resolve_device_range(const char* operation, const char* role, const void* pointer,
                                           size_t bytes, std::byte** shadow) const {
  if (const EmuDevice* device = device_containing(pointer)) {
    if ((*shadow = device->resolve(pointer, bytes)) != nullptr) return TB_SUCCESS;
    return fail(TB_ERROR_INVALID_POINTER, std::string(operation) + ": device " + role + " " +
                                              range_text(pointer, bytes) +
                                              " is not inside one live allocation of emu device " +
                                              std::to_string(device->index()));
  }
  return fail(TB_ERROR_INVALID_POINTER, std::string(operation) + ": device " + role + " " +
                                            range_text(pointer, bytes) +
                                            " is not device memory of this runtime");
}

tb_status EmuRuntime::check_host_range(const char* operation, const char* role, const void* pointer,
                                       size_t bytes) const {
  if (pointer == nullptr) {
    return fail(TB_ERROR_INVALID_VALUE,
                std::string(operation) + ": host " + role + " is NULL for " + std::to_string(bytes) + " bytes");
  }
  for (const auto& device : devices_) {
    if (device->memory().overlaps(pointer, bytes)) {
      return fail(TB_ERROR_INVALID_VALUE, std::string(operation) + ": host " + role + " " +
                                              range_text(pointer, bytes) + " lies in the memory of emu device " +
                                              std::to_string(device->index()) +
                                              "; the copy kind does not match the pointers");
    }
  }
  return TB_SUCCESS;
}

tb_status EmuRuntime::plan_copy(const char* operation, void* destination, const void* source, size_t bytes,
                                int kind_value, Transfer& transfer) {
  if (!is_valid_kind(kind_value)) {
    return fail(TB_ERROR_INVALID_VALUE, std::string(operation) + ": kind " + std::to_string(kind_value) +
                                            " is not a tb_memcpy_kind (1 host to device, 2 device to host, "
                                            "3 device to device)");
  }
  const auto kind = static_cast<tb_memcpy_kind>(kind_value);
  transfer = Transfer{};
  if (bytes == 0) return TB_SUCCESS;  // nothing to move, so nothing to validate (pointers may be NULL)

  const bool device_destination = kind != TB_MEMCPY_DEVICE_TO_HOST;
  const bool device_source = kind != TB_MEMCPY_HOST_TO_DEVICE;
  std::byte* shadow_destination = nullptr;
  std::byte* shadow_source = nullptr;
  tb_status status =
      device_destination
          ? resolve_device_range(operation, "destination", destination, bytes, &shadow_destination)
          : check_host_range(operation, "destination", destination, bytes);
  if (status != TB_SUCCESS) return status;
  status = device_source ? resolve_device_range(operation, "source", source, bytes, &shadow_source)
                         : check_host_range(operation, "source", source, bytes);
  if (status != TB_SUCCESS) return status;

  // Device to device may overlap (same allocation); host-side ranges cannot overlap device memory.
  transfer.kind = kind == TB_MEMCPY_DEVICE_TO_DEVICE ? Transfer::Kind::move : Transfer::Kind::copy;
  transfer.destination = device_destination ? static_cast<void*>(shadow_destination) : destination;
  transfer.source = device_source ? static_cast<const void*>(shadow_source) : source;
  transfer.bytes = bytes;
  transfer.fault = faults_.fault_for_copy(kind, bytes);  // last: only a valid copy may use up the fault
  return TB_SUCCESS;
}

tb_status EmuRuntime::memcpy_sync(void* destination, const void* source, size_t bytes, int kind) {
  Transfer transfer;
  if (const tb_status status = plan_copy("memcpy_sync", destination, source, bytes, kind, transfer);
      status != TB_SUCCESS) {
    return status;
  }
  // On the calling thread, now: runtime.h says a synchronous copy does not wait for stream work.
  transfer.execute();
  return TB_SUCCESS;
}

tb_status EmuRuntime::memcpy_async(void* destination, const void* source, size_t bytes, int kind,
                                   tb_stream handle) {
  std::shared_ptr<Stream> stream;
  if (const tb_status status = find_stream("memcpy_async", handle, stream); status != TB_SUCCESS) return status;
  Transfer transfer;
  if (const tb_status status = plan_copy("memcpy_async", destination, source, bytes, kind, transfer);
      status != TB_SUCCESS) {
    return status;
  }
  // Validated now, executed later: freeing the memory before the stream gets there is the
  // caller's bug, as on real devices (the shadow view stays mapped, so it cannot crash us).
  return enqueue("memcpy_async", handle, *stream, transfer);
}

tb_status EmuRuntime::memset_async(void* destination, int32_t value, size_t bytes, tb_stream handle) {
  std::shared_ptr<Stream> stream;
  if (const tb_status status = find_stream("memset_async", handle, stream); status != TB_SUCCESS) return status;
  Transfer transfer;
  transfer.kind = Transfer::Kind::fill;
  transfer.fill_value = static_cast<unsigned char>(value);  // as cudaMemset: the low byte of `value`
  transfer.bytes = bytes;
  if (bytes > 0) {
    std::byte* shadow = nullptr;
    if (const tb_status status = resolve_device_range("memset_async", "destination", destination, bytes, &shadow);
        status != TB_SUCCESS) {
      return status;
    }
    transfer.destination = shadow;
  }
  return enqueue("memset_async", handle, *stream, transfer);
}

tb_status EmuRuntime::enqueue(const char* operation, tb_stream handle, Stream& stream, const Transfer& transfer) {
  if (stream.enqueue([transfer] { transfer.execute(); })) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_HANDLE,
              std::string(operation) + ": stream " + pointer_text(handle) + " is being destroyed");
}

}  // namespace torchbridge::emu

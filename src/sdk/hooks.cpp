#include "sdk/hooks.h"

#include "sdk/caching_allocator.h"
#include "sdk/generator.h"
#include "sdk/host_allocator.h"
#include "sdk/runtime_handle.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace torchbridge::sdk {

void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "cannot resize a storage that is not resizable");
  const size_t old_bytes = impl->nbytes();
  if (new_bytes == old_bytes) return;
  // The allocator serves the current device; a storage grows on its own (an `out=` tensor on
  // emu:1 resized while emu:0 is current would otherwise move to emu:0 under its tensor's feet).
  const c10::DeviceGuard guard(impl->device());
  c10::DataPtr fresh = impl->allocator()->allocate(new_bytes);
  const size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0) {
    // Order the copy after everything queued on the storage's device so far.
    TB_CALL(device_synchronize, impl->device().index());
    TB_CALL(memcpy_sync, fresh.get(), impl->data(), keep, TB_MEMCPY_DEVICE_TO_DEVICE);
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

namespace {

class SdkHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return runtime().device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    TORCH_CHECK(device < runtime().device_count(), "torch.Generator(device=", runtime().name(), ":",
                static_cast<int>(device),
                "): '", runtime().name(), "' has ", runtime().device_count(), " device(s), valid indices 0..",
                runtime().device_count() - 1);
    return new_generator(device < 0 ? default_generator(-1).device().index() : device);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    const auto device = caching_allocator().device_of(data);
    TORCH_CHECK(device.has_value(), "pointer ", data, " was not allocated on any '", runtime().name(), "' device");
    return at::Device(c10::DeviceType::PrivateUse1, *device);
  }
  bool isPinnedPtr(const void* data) const override { return host_allocator().is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &host_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    return device >= 0 && device < runtime().device_count();
  }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(runtime().device_count()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { TB_CALL(set_device, device); }
  c10::DeviceIndex getCurrentDevice() const override {
    int32_t device = 0;
    TB_CALL(get_device, &device);
    return static_cast<c10::DeviceIndex>(device);
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex previous = getCurrentDevice();
    if (device != previous) setCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    resize_storage_bytes(storage, new_bytes);
  }
};

}  // namespace

at::PrivateUse1HooksInterface* make_hooks() { return new SdkHooks(); }

}  // namespace torchbridge::sdk

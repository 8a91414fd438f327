#pragma once
// What TorchBridge knows about the device occupying PyTorch's single PrivateUse1 slot.
// Any plugin that registered itself with PyTorch is served by the generic PrivateUse1 adapter;
// a plugin may additionally describe itself here so detection and reports can say more.

#include <torchbridge/device_info.h>

#include <functional>
#include <string>

namespace torchbridge {

struct PrivateUse1Declaration {
  std::string vendor;              // shown as DeviceInfo::vendor
  bool is_real_hardware = false;   // true lets detect_best_backend() prefer it over the CPU
  // Optional: adds what the plugin knows about device `index` (name, architecture, versions,
  // unified memory, ...) to the generic description.
  std::function<void(int index, DeviceInfo& info)> describe;
};

// Called by a device plugin after it registered with PyTorch. Without a declaration the device
// is still usable by name, but detect_best_backend() does not prefer it over the CPU: we cannot
// tell an emulator from hardware on our own.
void declare_privateuse1_device(const PrivateUse1Declaration& declaration);

}  // namespace torchbridge

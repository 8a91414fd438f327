#pragma once
// Where a device request written for another machine should go ("cuda:1" on a machine with only
// emu or a CPU). The Python package's redirection applies the same policy to every torch call.

#include <c10/core/Device.h>

#include <string>

namespace torchbridge {

struct DeviceResolution {
  c10::Device device{c10::kCPU};  // the device to use
  bool redirected = false;        // the type changed or the index was mapped
  bool index_wrapped = false;     // the requested index exceeded the device count (modulo applied)
};

// How the target was chosen. An explicitly named target (TORCHBRIDGE_BACKEND, or passed by the
// caller) takes every accelerator request, even for devices this machine has: a user who asks for
// cpu or emu on a CUDA machine gets cpu or emu. A detected target (the best backend) takes only
// requests for accelerators this process cannot use.
enum class RedirectTarget { kExplicit, kDetected };

// Policy:
//  - "cpu:-1" forces the CPU (compatibility with TorchDevice); "cpu" / "cpu:N" stay on the CPU;
//  - meta and lazy devices are not accelerators and stay;
//  - with a detected target, a device type this process can use stays, its index taken modulo its
//    device count;
//  - every other accelerator request (cuda, mps, xpu, ...) goes to `target_backend`, index modulo
//    the target's device count (no index stays no index).
// `target_backend` is a backend name or alias (SDK devices are loaded); unknown or unavailable
// targets and malformed requests raise naming the bad value.
DeviceResolution resolve_device(const std::string& requested, const std::string& target_backend,
                                RedirectTarget target = RedirectTarget::kExplicit);

}  // namespace torchbridge

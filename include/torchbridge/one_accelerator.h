#pragma once
// PyTorch's rule "one accelerator per process", made explicit.
//
// PyTorch's autograd engine synchronises streams for a single device type, at::getAccelerator().
// As soon as a device is registered as PrivateUse1 (every TorchBridge SDK device is), that type
// becomes PrivateUse1, and a backward pass on a native accelerator (CUDA, ROCm, XPU, MPS) in the
// same process dies in an internal assert of the engine. TorchBridge therefore refuses both
// orders with a clear error: registering an SDK device in a process that already used a native
// accelerator, and using a native accelerator backend in a process that holds an SDK device.
// Work that needs both (cross-backend validation, the portability run) runs the SDK device in a
// child process; see docs/device-sdk.md.

#include <optional>
#include <string>
#include <vector>

namespace torchbridge {

class Backend;

// Why, in one sentence, for every error that enforces the rule.
inline constexpr const char* kOneAcceleratorReason =
    "PyTorch's autograd engine serves one accelerator per process (at::getAccelerator()), and a "
    "device registered as PrivateUse1 becomes that accelerator, so a backward pass on the other "
    "device would fail inside PyTorch";


// The native accelerator this process has already used, as a phrase naming the evidence
// (e.g. "cuda (device 0 has a CUDA context)"), or nullopt when none has been used.
std::optional<std::string> native_accelerator_in_use();

// The SDK device registered as PrivateUse1 in this process, or nullopt.
std::optional<std::string> registered_privateuse1_device();

// True for backends whose devices are a native accelerator of torch (not the CPU, not
// PrivateUse1).
bool is_native_accelerator(const Backend& backend);

// (Which backends of a list must run in a process of their own: process_isolation.h.)


// Raises (c10::Error) unless SDK device `name` may become this process's PrivateUse1 device.
void check_sdk_device_may_register(const std::string& name);

// Raises (c10::Error) when `backend` is a native accelerator and an SDK device is registered.
void check_native_accelerator_may_be_used(const Backend& backend);

}  // namespace torchbridge

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

// The native accelerator this process has already used, as a phrase naming the evidence
// (e.g. "cuda (device 0 has a CUDA context)"), or nullopt when none has been used.
std::optional<std::string> native_accelerator_in_use();

// The SDK device registered as PrivateUse1 in this process, or nullopt.
std::optional<std::string> registered_privateuse1_device();

// True for backends whose devices are a native accelerator of torch (not the CPU, not
// PrivateUse1).
bool is_native_accelerator(const Backend& backend);

// Of `backends` (names or aliases), the SDK devices that cannot share a process with the rest
// because the list also names a native accelerator; empty when all can run in one process.
// Resolves names without loading anything.
std::vector<std::string> sdk_devices_needing_own_process(const std::vector<std::string>& backends);

// Raises (ValueError) when `backends` holds an SDK device and a native accelerator, which cannot
// share a process, naming both and the way out; `what` is the work, e.g. "validate".
void check_backends_can_share_a_process(const std::vector<std::string>& backends, const std::string& what);

// Raises (c10::Error) unless SDK device `name` may become this process's PrivateUse1 device.
void check_sdk_device_may_register(const std::string& name);

// Raises (c10::Error) when `backend` is a native accelerator and an SDK device is registered.
void check_native_accelerator_may_be_used(const Backend& backend);

}  // namespace torchbridge

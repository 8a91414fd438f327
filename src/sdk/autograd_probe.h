#pragma once
// Whether PyTorch's autograd engine can run a backward pass on the SDK device just registered
// (autograd_probe.cpp says how it finds out).

#include <optional>
#include <string>

namespace torchbridge::sdk {

// The reason a backward pass on device `name` (with `device_count` devices) would fail inside
// PyTorch, or nullopt when the engine serves it. Call right after registering the device, outside
// any lock an operator may take (it starts autograd's device threads if no backward pass has yet).
std::optional<std::string> autograd_cannot_serve(const std::string& name, int device_count);

}  // namespace torchbridge::sdk

#pragma once
// How many devices of one type torch can reach in this process, asked of the type's device guard:
// the one question the backends, the checkpoint reader and autocast each need answered the same way.
// Internal to the library.

#include <c10/core/DeviceType.h>

#include <optional>

namespace torchbridge::detail {

// std::nullopt when no device guard is registered for the type (a torch built without it, or an
// SDK device whose library is not loaded); otherwise the guard's count, possibly 0. Never creates
// a device context.
std::optional<int> devices_in_process(c10::DeviceType type);

}  // namespace torchbridge::detail

#pragma once
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torchbridge::sdk {
// The DeviceGuardImpl for the registered SDK device (device switching, streams, events).
const c10::impl::DeviceGuardImplInterface* make_guard_impl();
}  // namespace torchbridge::sdk

#include "core/devices_in_process.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torchbridge::detail {

std::optional<int> devices_in_process(c10::DeviceType type) {
  if (!c10::impl::hasDeviceGuardImpl(type)) return std::nullopt;
  return static_cast<int>(c10::impl::getDeviceGuardImpl(type)->deviceCount());
}

}  // namespace torchbridge::detail

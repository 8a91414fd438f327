#pragma once
// Which SDK devices have host-addressable memory: on those the CPU fallback runs kernels directly
// on device memory instead of on host copies (see host_replicas.h).

#include <c10/core/Device.h>

namespace torchbridge::sdk {

// Whether device `index` reported host-addressable memory (read once at registration).
bool host_addressable(c10::DeviceIndex index);
void init_host_addressable(int device_count);

}  // namespace torchbridge::sdk

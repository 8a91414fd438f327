#pragma once
// The CPU fallback for devices whose memory the host can address directly: instead of copying
// arguments to the host and results back, CPU kernels run on host aliases of device memory.

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchbridge::sdk {

// Whether device `index` reported host-addressable memory (read once at registration).
bool host_addressable(c10::DeviceIndex index);
void init_host_addressable(int device_count);

// Runs `op` on the CPU over aliases of the device tensors on `stack`. Returns false (stack
// untouched) when the arguments need the copying fallback instead.
bool run_in_place(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchbridge::sdk

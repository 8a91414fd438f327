#pragma once
// How the CPU fallback hands device tensors to a CPU kernel. Internal to the SDK glue.
//
// A kernel's result may depend on more than its arguments' values: on an out= tensor's size
// (resize), strides and storage offset, on whether it overlaps itself, and on whether arguments
// share memory. So every device storage that holds a written argument is replicated on the host
// as a whole, and each argument in it becomes a CPU view with the device tensor's own dtype,
// sizes, strides and offset: the kernel sees exactly the memory the device tensors describe, and
// whatever it does (write through strides, resize, raise on overlap) is what the CPU would do.
// On host-addressable devices the replica is the device memory itself; otherwise it is a host copy
// of the bytes the arguments span, written back after the kernel.

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchbridge::sdk {

// Runs `op`'s CPU kernel for the SDK-device arguments on `stack` and leaves device results there.
void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchbridge::sdk

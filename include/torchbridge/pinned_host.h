#pragma once
// Host memory pinned for one device type's copies.
//
// `at::empty(..., pinned_memory(true))` and Python's `torch.empty(..., pin_memory=True)` pin for
// CUDA whenever the process has CUDA, even when another accelerator (an SDK device registered as
// PrivateUse1) is the process's (ATen's EmptyTensor.cpp prefers CUDA). An SDK device does not
// know CUDA's pinned blocks: it copies them as pageable memory, synchronously, so an offload that
// relies on asynchronous copies silently loses its overlap on a machine with a GPU. This takes the
// pinned allocator of the device type named, whatever else the process has.

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

namespace torchbridge {

// An uninitialised CPU tensor with `like`'s sizes and dtype, laid out as empty_like lays it out
// (`like`'s strides where it is dense, else dense ones in its order of dimensions), in host memory pinned by `device_type`'s pinned allocator. Raises
// naming the device type when torch has no pinned allocator for it.
at::Tensor pinned_host_like(const at::Tensor& like, c10::DeviceType device_type);

}  // namespace torchbridge

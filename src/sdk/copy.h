#pragma once
// Moving tensor bytes between the host and SDK devices. Internal to the SDK glue.

#include <torchbridge/sdk/runtime.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>

namespace torchbridge::sdk {

// aten::_copy_from: copies `self` into `dst`, where at least one of them is on the SDK device.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
// A CPU tensor with the same sizes, strides and contents as device tensor `t`.
at::Tensor download(const at::Tensor& t);
// A host tensor laid out like device tensor `dst`, to be modified and then upload()ed: fresh when
// `dst` is dense, otherwise holding `dst`'s current bytes.
at::Tensor staging_for(const at::Tensor& dst);
// Writes the elements of CPU tensor `staging` (laid out like `dst`) into device tensor `dst`: its
// storage span when `dst` is dense, else only the bytes of its elements, never the holes between.
void upload(const at::Tensor& staging, const at::Tensor& dst);

// Host code may only touch device memory once the device's queued work on it is done.
void wait_for_device(c10::DeviceIndex device);
// Raw bytes between host and device memory, on the calling thread. Only after wait_for_device():
// with the device's queued work done, nothing is ordered before the copy.
void copy_bytes_after_wait(void* dst, const void* src, size_t bytes, tb_memcpy_kind kind);

}  // namespace torchbridge::sdk

#pragma once
// Moving tensor bytes between the host and SDK devices. Internal to the SDK glue.

#include <ATen/core/Tensor.h>

namespace torchbridge::sdk {

// aten::_copy_from: copies `self` into `dst`, where at least one of them is on the SDK device.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
// A CPU tensor with the same sizes, strides and contents as device tensor `t`.
at::Tensor download(const at::Tensor& t);
// A host tensor laid out like device tensor `dst`, to be modified and then upload()ed: fresh when
// `dst` is dense, otherwise holding `dst`'s current bytes.
at::Tensor staging_for(const at::Tensor& dst);
// Writes the storage span of CPU tensor `staging` (laid out like `dst`) into device tensor `dst`.
void upload(const at::Tensor& staging, const at::Tensor& dst);

}  // namespace torchbridge::sdk

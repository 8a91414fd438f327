#pragma once
// Tensors cross the extension boundary as DLPack capsules (the protocol torch.from_dlpack and
// torch.utils.dlpack.to_dlpack speak), so the extension needs no torch Python headers and no
// libtorch_python. Only CPU tensors cross; Python moves them to devices itself.

#include <ATen/core/Tensor.h>

#include <pybind11/pybind11.h>

namespace torchbridge::python {

// A "dltensor" capsule owning a reference to `tensor` (a CPU tensor).
pybind11::capsule to_capsule(const at::Tensor& tensor);
// The tensor inside a "dltensor" capsule made by torch.utils.dlpack.to_dlpack; consumes it.
at::Tensor from_capsule(const pybind11::capsule& capsule);

}  // namespace torchbridge::python

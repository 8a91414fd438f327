#pragma once
// How tensors reach C++ from Python in torchbridge._C's amp and fp8 bindings.
//
// This extension does not link libtorch_python (bindings.cpp), and DLPack capsules carry CPU
// tensors only, so neither can hand C++ a tensor on emu or CUDA. Python passes `tensor._cdata`
// instead, the address of the tensor's TensorImpl, and C++ takes a new reference to that same
// TensorImpl (intrusive_ptr::reclaim_copy): C++ sees the very tensor Python holds, on any device,
// with no copy. It is sound because (1) the Python caller keeps every tensor alive for the call
// (a Python temporary such as `t.t()._cdata` is NOT kept alive: bind it to a name first), and C++
// keeps its own reference for tensors it stores; (2) the C++ side only writes into tensors Python
// created, so nothing C++ creates has to be wrapped back into a Python object, which is what would
// need libtorch_python. Linking libtorch_python was rejected: it ties the wheel to one torch
// build's Python ABI, which the rest of the extension avoids.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <utility>

namespace torchbridge::python {

// The tensor whose TensorImpl lives at `address` (a Python tensor's _cdata), sharing it.
inline at::Tensor tensor_at(std::uintptr_t address) {
  TORCH_CHECK_VALUE(address != 0, "torchbridge._C: a null tensor address was passed");
  auto impl = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
      reinterpret_cast<c10::TensorImpl*>(address));
  return at::Tensor(std::move(impl));
}

}  // namespace torchbridge::python

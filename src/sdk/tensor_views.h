#pragma once
// Tensors built directly over existing memory, without the dispatcher: the SDK glue uses them to
// hand device bytes (or host copies of them) to CPU kernels. Internal to the SDK glue.

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include <cstddef>
#include <cstdint>

namespace torchbridge::sdk {

// A tensor over `storage` with the given layout, built directly (no dispatch, no allocation).
inline at::Tensor view_of(const c10::Storage& storage, c10::DispatchKey key, caffe2::TypeMeta dtype, int64_t offset,
                          c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(key), dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

// A CPU tensor reading `data` (owned by the caller, at least `bytes` long) laid out as `like`
// from its first element: `like`'s dtype, sizes and strides, offset 0. Not resizable.
inline at::Tensor cpu_view_of_memory(void* data, size_t bytes, const at::Tensor& like) {
  const c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, c10::DataPtr(data, c10::Device(c10::kCPU)),
                             /*allocator=*/nullptr, /*resizable=*/false);
  return view_of(storage, c10::DispatchKey::CPU, like.dtype(), 0, like.sizes(), like.strides());
}

}  // namespace torchbridge::sdk

// The operators an SDK device implements natively: creation, views, resizing, set_, copies,
// scalar reads, fill and zero. Everything else reaches the CPU fallback (cpu_fallback.cpp).
#include "sdk/registration.h"

#include "sdk/caching_allocator.h"
#include "sdk/copy.h"
#include "sdk/hooks.h"
#include "sdk/recursion_guard.h"
#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <utility>

namespace torchbridge::sdk {
namespace {

const c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

// Under torch.use_deterministic_algorithms(True) with fill_uninitialized_memory (its default), new
// memory reads NaN (integers: their maximum), as torch's own empty and resize_ make it on the CPU
// and CUDA; a block reused from the cache gave back its old values.
bool fill_new_memory() {
  return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (fill_new_memory() && t.numel() > 0) at::native::fill_empty_deterministic_(t);
  return t;
}

c10::Device target_device(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) return *device;
  int32_t current = 0;
  TB_CALL(get_device, &current);
  return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_stack_headroom("aten::empty.memory_format");  // recursions that create device tensors stop here
  TORCH_CHECK(!pin_memory.value_or(false), "only CPU tensors can be pinned, not ", runtime().name(), " tensors");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, runtime().name(), " supports strided tensors only");
  const c10::DeviceGuard guard(target_device(device));
  return filled_if_deterministic(
      at::detail::empty_generic(size, &caching_allocator(), kKeys, c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_stack_headroom("aten::empty_strided");
  TORCH_CHECK(!pin_memory.value_or(false), "only CPU tensors can be pinned, not ", runtime().name(), " tensors");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, runtime().name(), " supports strided tensors only");
  const c10::DeviceGuard guard(target_device(device));
  return filled_if_deterministic(
      at::detail::empty_strided_generic(size, stride, &caching_allocator(), kKeys, c10::dtype_or_default(dtype)));
}

const at::Tensor& resize_in_place(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  // As torch's own resize_: the same sizes keep the strides, so a strided view (e.g. an in-place
  // result written back by the CPU fallback) is not silently re-laid out as contiguous.
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  const size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.element_size(),
                                                         self.storage_offset());
  const auto old_bytes = static_cast<int64_t>(self.storage().nbytes());
  if (needed > self.storage().nbytes()) {
    resize_storage_bytes(self.storage(), needed);
    if (fill_new_memory()) at::native::fill_resize_deterministic_(self, old_bytes);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  // A storage too small for the view grows, as the CPU's and CUDA's do; torch's generic
  // implementation would grow it with a host memcpy, so it is grown here, on the device.
  const size_t needed = stride.data() != nullptr
                            ? at::detail::computeStorageNbytes(size, stride, self.element_size(), storage_offset)
                            : at::detail::computeStorageNbytesContiguous(size, self.element_size(), storage_offset);
  // Only a storage the call can take: torch's own checks (the device, the offset) refuse the others,
  // which must not have been grown first.
  if (needed > source.nbytes() && source.device() == self.device() && storage_offset >= 0) {
    resize_storage_bytes(source, needed);
  }
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &caching_allocator(), /*resizable=*/true);
  return self.set_(storage, 0, {0}, {});
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_in_place(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(download(self)); }

at::Tensor& fill(at::Tensor& self, const c10::Scalar& value) {
  if (self.numel() == 0) return self;
  at::Tensor staging = staging_for(self);
  staging.fill_(value);
  upload(staging, self);
  return self;
}

// fill_ with a 0-dim tensor: torch takes the value from any device (Fill.cpp reads it with item()),
// so a CPU buffer filled from a device scalar works, as with CUDA; through the CPU fallback, whose
// device rule knows no such exception, it was refused. Dispatch comes here for a CPU `self` too.
at::Tensor& fill_from_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", value.dim(),
              " dimensions.");
  const c10::Scalar scalar = value.item();
  if (self.device().type() != c10::DeviceType::PrivateUse1) return self.fill_(scalar);
  return fill(self, scalar);
}

at::Tensor& zero(at::Tensor& self) {
  if (self.numel() == 0) return self;
  if (!self.is_non_overlapping_and_dense()) return fill(self, 0);
  // Dense: every byte of the span belongs to the tensor, so the runtime's memset does it on-device.
  const c10::Stream stream = current_stream(self.device().index());
  TB_CALL(memset_async, self.data_ptr(), 0, static_cast<size_t>(self.numel()) * self.element_size(),
          native_stream(stream));
  return self;
}

// Whether `from`'s data may be swapped into `self` (Variable::set_data, used by Module::to).
// torch's own answer only knows its built-in dense backends; an SDK device's tensors are plain
// strided TensorImpls like CPU tensors, so any two plain strided tensors are compatible.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto plain = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested();
  };
  return plain(self) && plain(from);
}

}  // namespace

void register_native_ops() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  library->impl("empty_strided", TORCH_FN(empty_strided));
  library->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  library->impl("view", TORCH_FN(at::native::view));
  library->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  // The view operators torch gives per-backend (not composite) kernels: through the CPU fallback
  // they would return copies, so writes through the "view" were lost (and complex make_tensor on
  // the device, which fills view_as_real(result), left its result uninitialized). torch's own
  // kernels only compute geometry over the same storage, so they serve any device.
  library->impl("unfold", TORCH_FN(at::native::unfold));
  library->impl("view_as_real", TORCH_FN(at::native::view_as_real));
  library->impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  library->impl("resize_", TORCH_FN(resize_in_place));
  library->impl("set_.source_Storage", TORCH_FN(at::native::set_));
  library->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  library->impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  library->impl("set_", TORCH_FN(set_empty));
  library->impl("_copy_from", TORCH_FN(copy_from));
  library->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  library->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  library->impl("fill_.Scalar", TORCH_FN(fill));
  library->impl("fill_.Tensor", TORCH_FN(fill_from_tensor));
  library->impl("zero_", TORCH_FN(zero));
  library->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

}  // namespace torchbridge::sdk

// The commonest elementwise operators (add, sub, mul, div and their in-place forms) still run
// torch's CPU kernels, but without the boxed fallback's general machinery: no IValue stack, no
// storage replicas, no dispatch to create or copy tensors. Their operands, when every one is a
// plain dense tensor on one SDK device (or a CPU scalar), go to the CPU kernel as raw bytes: the
// device memory itself where the host may address it, otherwise one copy into a reused host
// buffer; the result comes back with one copy. Anything else (views with holes, math bits,
// mixed devices, an in-place operand sharing memory with its input) takes the boxed
// fallback, which handles every case, so both paths compute the same values and raise the same
// errors. Both count the run under the same operator and both honour strict mode.
#include "sdk/registration.h"

#include "sdk/caching_allocator.h"
#include "sdk/copy.h"
#include "sdk/fallback.h"
#include "sdk/in_place_fallback.h"
#include "sdk/tensor_views.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/add.h>
#include <ATen/ops/div.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sub.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

// Operands up to this size are copied into a per-thread buffer; larger ones get host memory of
// their own, so a thread never keeps a large buffer alive.
constexpr size_t kScratchBytes = 64 * 1024;

bool on_sdk_device(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// An operand the shortcut can hand over as raw bytes: a plain dense tensor on `device`, whose
// bytes from its first element are exactly its elements, or a CPU scalar (0-dim), which the CPU
// kernel takes as it is, as it would from the boxed fallback.
bool shortcut_operand(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.layout() != c10::kStrided || t.is_conj() || t.is_neg()) return false;
  if (t.is_cpu()) return t.dim() == 0;
  return t.device() == device && t.has_storage() && t.is_non_overlapping_and_dense();
}

size_t dense_bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

void* scratch_buffer(size_t slot) {
  thread_local std::array<c10::DataPtr, 2> buffers;
  c10::DataPtr& buffer = buffers.at(slot);
  if (!buffer) buffer = c10::GetCPUAllocator()->allocate(kScratchBytes);
  return buffer.get();
}

// The CPU tensor the kernel gets for operand `t`: `t` itself when it is a CPU scalar, the device
// memory itself where the host may address it, otherwise a copy of `t`'s bytes (in scratch
// buffer `slot` when small enough).
at::Tensor host_operand(const at::Tensor& t, bool addressable, size_t slot) {
  if (!on_sdk_device(t)) return t;
  const size_t bytes = dense_bytes(t);
  if (addressable) return cpu_view_of_memory(t.data_ptr(), bytes, t);
  if (bytes > kScratchBytes) {
    const c10::Storage own(c10::Storage::use_byte_size_t(), bytes, c10::GetCPUAllocator(), /*resizable=*/false);
    copy_bytes_after_wait(own.mutable_data(), t.data_ptr(), bytes, TB_MEMCPY_DEVICE_TO_HOST);
    return view_of(own, c10::DispatchKey::CPU, t.dtype(), 0, t.sizes(), t.strides());
  }
  void* host = scratch_buffer(slot);
  copy_bytes_after_wait(host, t.data_ptr(), bytes, TB_MEMCPY_DEVICE_TO_HOST);
  return cpu_view_of_memory(host, bytes, t);
}

// The CPU kernel's result as a new tensor on `device`, laid out as the kernel laid it out.
at::Tensor to_device(const at::Tensor& host, c10::Device device) {
  if (!host.is_non_overlapping_and_dense()) return host.to(device);
  const c10::DeviceGuard guard(device);
  at::Tensor out = at::detail::empty_strided_generic(host.sizes(), host.strides(), &caching_allocator(),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                     host.scalar_type());
  copy_bytes_after_wait(out.data_ptr(), host.data_ptr(), dense_bytes(host), TB_MEMCPY_HOST_TO_DEVICE);
  return out;
}

template <typename... Extra>
torch::jit::Stack boxed(const c10::OperatorHandle& op, const at::Tensor& self, const at::Tensor& other,
                        const Extra&... extra) {
  torch::jit::Stack stack;
  torch::jit::push(stack, self, other, extra...);
  boxed_cpu_fallback(op, &stack);
  return stack;
}

// self OP other, computed by `compute` on host tensors.
template <typename Compute, typename... Extra>
at::Tensor functional(const c10::OperatorHandle& op, const at::Tensor& self, const at::Tensor& other,
                      const Compute& compute, const Extra&... extra) {
  const c10::Device device = on_sdk_device(self) ? self.device() : other.device();
  if (!shortcut_operand(self, device) || !shortcut_operand(other, device)) {
    return boxed(op, self, other, extra...).back().toTensor();
  }
  note_cpu_fallback(op);
  const bool addressable = host_addressable(device.index());
  wait_for_device(device.index());  // then every copy and host access runs at once, in order
  return to_device(compute(host_operand(self, addressable, 0), host_operand(other, addressable, 1)), device);
}

// self OP= other, computed by `compute` on host tensors.
template <typename Compute, typename... Extra>
at::Tensor& in_place(const c10::OperatorHandle& op, at::Tensor& self, const at::Tensor& other,
                     const Compute& compute, const Extra&... extra) {
  const c10::Device device = self.device();
  // Operands sharing memory would reach the CPU kernel as separate copies or separate storages,
  // hiding an overlap it must see (it raises for a partial one); the boxed fallback keeps one
  // storage per device storage.
  const bool shares_memory = on_sdk_device(other) && self.storage().is_alias_of(other.storage());
  if (!on_sdk_device(self) || !shortcut_operand(self, device) || !shortcut_operand(other, device) ||
      shares_memory) {
    boxed(op, self, other, extra...);
    return self;
  }
  note_cpu_fallback(op);
  const bool addressable = host_addressable(device.index());
  wait_for_device(device.index());
  at::Tensor host_self = host_operand(self, addressable, 0);
  compute(host_self, host_operand(other, addressable, 1));
  if (!addressable) {
    copy_bytes_after_wait(self.data_ptr(), host_self.data_ptr(), dense_bytes(self), TB_MEMCPY_HOST_TO_DEVICE);
  }
  return self;
}

c10::OperatorHandle operator_handle(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  static const c10::OperatorHandle op = operator_handle("aten::add", "Tensor");
  return functional(op, self, other, [&](const at::Tensor& a, const at::Tensor& b) { return at::add(a, b, alpha); },
                    alpha);
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  static const c10::OperatorHandle op = operator_handle("aten::sub", "Tensor");
  return functional(op, self, other, [&](const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b, alpha); },
                    alpha);
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  static const c10::OperatorHandle op = operator_handle("aten::mul", "Tensor");
  return functional(op, self, other, [](const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); });
}

at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  static const c10::OperatorHandle op = operator_handle("aten::div", "Tensor");
  return functional(op, self, other, [](const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); });
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  static const c10::OperatorHandle op = operator_handle("aten::add_", "Tensor");
  return in_place(op, self, other, [&](at::Tensor& a, const at::Tensor& b) { a.add_(b, alpha); }, alpha);
}

at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  static const c10::OperatorHandle op = operator_handle("aten::sub_", "Tensor");
  return in_place(op, self, other, [&](at::Tensor& a, const at::Tensor& b) { a.sub_(b, alpha); }, alpha);
}

at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  static const c10::OperatorHandle op = operator_handle("aten::mul_", "Tensor");
  return in_place(op, self, other, [](at::Tensor& a, const at::Tensor& b) { a.mul_(b); });
}

at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  static const c10::OperatorHandle op = operator_handle("aten::div_", "Tensor");
  return in_place(op, self, other, [](at::Tensor& a, const at::Tensor& b) { a.div_(b); });
}

}  // namespace

void register_elementwise_fast_path() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("add.Tensor", TORCH_FN(add));
  library->impl("sub.Tensor", TORCH_FN(sub));
  library->impl("mul.Tensor", TORCH_FN(mul));
  library->impl("div.Tensor", TORCH_FN(div));
  library->impl("add_.Tensor", TORCH_FN(add_));
  library->impl("sub_.Tensor", TORCH_FN(sub_));
  library->impl("mul_.Tensor", TORCH_FN(mul_));
  library->impl("div_.Tensor", TORCH_FN(div_));
}

}  // namespace torchbridge::sdk

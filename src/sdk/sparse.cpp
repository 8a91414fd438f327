// Sparse layouts (COO, and the compressed CSR/CSC/BSR/BSC) on SDK devices. A sparse tensor is a
// handful of dense member tensors (indices, values) plus metadata, and torch's kernels that only
// build, inspect, resize or copy that structure are device-generic: they are registered here as
// native kernels for SparsePrivateUse1 / SparseCsrPrivateUse1, so a sparse tensor can live on the
// device and move to and from the CPU. Every computation on sparse tensors runs on the CPU through
// the same counted, strict-mode-aware boxed fallback as dense operators (cpu_fallback.cpp).
//
// torch's own CPU fallback re-dispatches to the dense CPU key, so operators with sparse arguments
// take a copying path of their own (run_sparse_on_cpu): arguments to the CPU with their layout, a
// full dispatch there (SparseCPU, SparseCsrCPU, ...), results and written arguments back.
//
// One dispatch rule needs a second step. For the sparse keys a CompositeExplicitAutograd kernel
// outranks a backend fallback, and many such kernels are the dense path or a "not supported for
// this layout" error (col_indices' default raises for every layout). Where torch has a dedicated
// SparseCPU / SparseCsrCPU kernel for an operator, the device must take the same road, so the
// fallback is registered for that operator explicitly.
#include "sdk/registration.h"

#include "sdk/fallback.h"

#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

bool on_sdk_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

bool is_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

bool has_sparse_tensor(const c10::IValue& value) {
  const auto sparse = [](const at::Tensor& t) { return t.defined() && t.layout() != c10::kStrided; };
  if (value.isTensor()) return sparse(value.toTensor());
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList().vec()) if (sparse(t)) return true;
  }
  if (value.isOptionalTensorList()) {
    for (const auto& t : value.toOptionalTensorList().vec()) if (t.has_value() && sparse(*t)) return true;
  }
  return false;
}

// The CPU fallback writes a mutated sparse argument back with _copy_from_and_resize; for sparse
// tensors copy_ replaces the structure (sizes, nnz) as well as the values.
at::Tensor sparse_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.copy_(self);
  return dst;
}

// torch's generated wrappers make the named device current before a sparse constructor runs;
// registered directly, the constructors would build the sparse tensor's empty members on the
// current device and then meet members on another (torch's internal assertion
// "device() == values_.device()" for a COO tensor built on emu:1 while emu:0 is current).
at::Tensor empty_coo_on(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                        std::optional<at::Device> device, std::optional<bool> pin_memory,
                        std::optional<at::MemoryFormat> memory_format) {
  const c10::OptionalDeviceGuard guard(device);
  return at::native::empty_sparse(size, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor empty_compressed_on(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const c10::OptionalDeviceGuard guard(device);
  return at::native::empty_sparse_compressed(size, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor empty_coo_like(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                          std::optional<at::Device> device, std::optional<bool> pin_memory,
                          std::optional<at::MemoryFormat> memory_format) {
  const c10::OptionalDeviceGuard guard(device.has_value() ? device : std::optional(self.device()));
  return at::native::empty_like_sparse_coo(self, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor new_coo_with_dims(int64_t sparse_dim, int64_t dense_dim, at::IntArrayRef size,
                             std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                             std::optional<at::Device> device, std::optional<bool> pin_memory) {
  const c10::OptionalDeviceGuard guard(device);
  return at::native::new_with_dims_sparse(sparse_dim, dense_dim, size, dtype, layout, device, pin_memory);
}

at::Tensor new_coo_with_tensors(int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
                                const at::Tensor& indices, const at::Tensor& values,
                                std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                std::optional<at::Device> device, std::optional<bool> pin_memory,
                                std::optional<bool> is_coalesced) {
  const c10::OptionalDeviceGuard guard(device.has_value() ? device : std::optional(values.device()));
  return at::native::new_with_dims_and_tensor_sparse_symint(sparse_dim, dense_dim, size, indices, values, dtype,
                                                            layout, device, pin_memory, is_coalesced);
}

void register_structure_kernels() {
  static auto* coo = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1,
                                        __FILE__, __LINE__);
  coo->impl("empty.memory_format", TORCH_FN(empty_coo_on));
  coo->impl("empty_like", TORCH_FN(empty_coo_like));
  coo->impl("_sparse_coo_tensor_with_dims", TORCH_FN(new_coo_with_dims));
  coo->impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(new_coo_with_tensors));
  coo->impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  coo->impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  coo->impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  coo->impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  coo->impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  coo->impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  coo->impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  coo->impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  coo->impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  coo->impl("_indices", TORCH_FN(at::native::_indices_sparse));
  coo->impl("_values", TORCH_FN(at::native::_values_sparse));
  coo->impl("indices", TORCH_FN(at::native::indices_sparse));
  coo->impl("values", TORCH_FN(at::native::values_sparse));
  coo->impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  // copy_ of a COO tensor: torch's sparse wrapper, as SparseCPU has; routed to the fallback, the
  // write-back of every in-place COO operator (itself a copy_ from the CPU) was refused there.
  coo->impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  coo->impl("zero_", TORCH_FN(at::native::zero_sparse_));
  coo->impl("clone", TORCH_FN(at::native::clone_sparse));
  coo->impl("_copy_from_and_resize", TORCH_FN(sparse_copy_from_and_resize));

  static auto* compressed = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::SparseCsrPrivateUse1,
                                               __FILE__, __LINE__);
  compressed->impl("empty.memory_format", TORCH_FN(empty_compressed_on));
  compressed->impl("empty_like", TORCH_FN(at::native::empty_like_sparse_csr));
  compressed->impl("resize_", TORCH_FN(at::native::resize_sparse_csr_));
  compressed->impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_compressed_));
  compressed->impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  compressed->impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  compressed->impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  compressed->impl("values", TORCH_FN(at::native::values_sparse_csr));
  compressed->impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  compressed->impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  compressed->impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  compressed->impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  compressed->impl("copy_", TORCH_FN(at::native::copy_sparse_compressed_));
  compressed->impl("clone", TORCH_FN(at::native::clone_sparse_compressed));
  compressed->impl("zero_", TORCH_FN(at::native::zero_sparse_csr_));
  compressed->impl("_copy_from_and_resize", TORCH_FN(sparse_copy_from_and_resize));
}

// For every aten operator with a dedicated kernel for `cpu_key` that the device would otherwise
// run through a composite kernel, the boxed CPU fallback, explicitly.
void route_composites_to_fallback(c10::DispatchKey cpu_key, c10::DispatchKey device_key) {
  auto* library = new torch::Library(torch::Library::IMPL, "aten", device_key, __FILE__, __LINE__);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle || !handle->hasKernelForDispatchKey(cpu_key) || handle->hasKernelForDispatchKey(device_key)) continue;
    if (!handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;  // the backend fallback is reached anyway
    }
    const std::string overload = name.overload_name.empty() ? "" : "." + name.overload_name;
    const std::string qualified = name.name.substr(6) + overload;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed_cpu_fallback>());
  }
}

}  // namespace

bool run_sparse_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  bool sparse = false;
  std::optional<c10::Device> device;
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& value = (*stack)[i];
    sparse = sparse || has_sparse_tensor(value);
    if (!device && value.isTensor() && on_sdk_device(value.toTensor())) device = value.toTensor().device();
    if (!device && value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList().vec()) if (!device && on_sdk_device(t)) device = t.device();
    }
  }
  if (!sparse) return false;
  // requires_grad travels with the copy: below autograd it records nothing, but some CPU kernels
  // read it (sparse.mm's amax/amin forward keeps the argmax only for an input requiring grad, and
  // its backward reads that argmax unchecked: without the flag the backward crashed).
  const auto to_cpu = [](const at::Tensor& t) {
    if (!on_sdk_device(t)) return t;
    at::Tensor host = t.cpu();
    if (t.requires_grad()) host.set_requires_grad(true);
    return host;
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> written(arguments.size());  // (device tensor, its CPU copy)
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) {
      const at::Tensor original = value.toTensor();
      const at::Tensor host = to_cpu(original);
      if (is_written(arguments[i]) && on_sdk_device(original)) written[i] = {original, host};
      value = c10::IValue(host);
    } else if (value.isTensorList()) {
      TORCH_CHECK(!is_written(arguments[i]), "operator ", c10::toString(op.operator_name()),
                  " writes into a list of sparse device tensors, which the CPU fallback does not support");
      std::vector<at::Tensor> hosts;
      for (const at::Tensor& t : value.toTensorList().vec()) hosts.push_back(to_cpu(t));
      value = c10::IValue(c10::List<at::Tensor>(hosts));
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> hosts;
      for (const auto& t : value.toOptionalTensorList().vec()) {
        hosts.push_back(t.has_value() ? std::optional<at::Tensor>(to_cpu(*t)) : std::nullopt);
      }
      value = c10::IValue(hosts);
    }
  }

  op.callBoxed(stack);

  for (const auto& [original, host] : written) {
    if (!original.defined()) continue;
    if (original.layout() == c10::kStrided && original.sizes() != host.sizes()) original.resize_(host.sizes());
    original.copy_(host);  // sparse copy_ replaces sizes and nnz as well
  }
  const c10::Device target = device.value_or(c10::Device(c10::DeviceType::PrivateUse1));
  const auto& returns = op.schema().returns();
  const size_t first_return = stack->size() - returns.size();
  for (size_t r = 0; r < returns.size(); ++r) {
    c10::IValue& value = (*stack)[first_return + r];
    bool replaced = false;
    if (is_written(returns[r])) {  // a returned written argument is the caller's own device tensor
      for (size_t i = 0; i < arguments.size() && !replaced; ++i) {
        if (written[i].first.defined() && is_written(arguments[i]) &&
            arguments[i].alias_info()->beforeSets() == returns[r].alias_info()->beforeSets()) {
          value = c10::IValue(written[i].first);
          replaced = true;
        }
      }
    }
    if (replaced) continue;
    if (value.isTensor() && value.toTensor().defined()) {
      value = c10::IValue(value.toTensor().to(target));
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) list[k] = list.get(k).to(target);
      value = c10::IValue(list);
    }
  }
  return true;
}

void register_sparse() {
  register_structure_kernels();
  for (const auto key : {c10::DispatchKey::SparsePrivateUse1, c10::DispatchKey::SparseCsrPrivateUse1}) {
    static std::vector<torch::Library*> libraries;
    libraries.push_back(new torch::Library(torch::Library::IMPL, "_", key, __FILE__, __LINE__));
    libraries.back()->fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_cpu_fallback>());
  }
  route_composites_to_fallback(c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1);
  route_composites_to_fallback(c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1);
}

}  // namespace torchbridge::sdk

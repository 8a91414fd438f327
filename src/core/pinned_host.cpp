// pinned_host_like (include/torchbridge/pinned_host.h).
#include <torchbridge/pinned_host.h>

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/Allocator.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/DimVector.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchbridge {

at::Tensor pinned_host_like(const at::Tensor& like, c10::DeviceType device_type) {
  TORCH_CHECK_VALUE(like.defined(), "pinned_host_like: an undefined tensor was given");
  const std::string name = c10::DeviceTypeName(device_type, /*lower_case=*/true);
  TORCH_CHECK_VALUE(at::isAccelerator(device_type), "pinned_host_like: ", name,
                    " is not an accelerator, and host memory is pinned for an accelerator's copies");
  c10::Allocator* allocator = nullptr;
  try {
    // Through the context, not the device's hooks directly: this also marks the device initialised,
    // without which torch's is_pinned() answers false for every pointer (Context::isPinnedPtr).
    allocator = at::globalContext().getPinnedMemoryAllocator(device_type);
  } catch (const c10::Error& e) {  // a torch without that accelerator, no driver, nothing registered
    TORCH_CHECK_VALUE(false, "pinned_host_like: torch has no pinned host memory for ", name, " in this process: ",
                      e.what_without_backtrace());
  }
  // As empty_like lays it out: `like`'s strides where it is dense, otherwise dense strides in its
  // order of dimensions. Row-major instead changed a transposed view's layout, and with it the
  // rounding of backward kernels that took the copy for the original (offload_activations).
  const c10::DimVector strides = like.is_non_overlapping_and_dense()
                                     ? c10::DimVector(like.strides())
                                     : c10::DimVector(at::infer_dense_strides(like.sizes(), like.strides()));
  return at::detail::empty_strided_generic(like.sizes(), strides, allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::CPU), like.scalar_type());
}

}  // namespace torchbridge

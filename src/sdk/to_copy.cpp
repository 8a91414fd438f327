// _to_copy on SDK devices: a non_blocking copy to the CPU lands in host memory pinned by this
// device, so it is queued on the device's stream as torch's own kernel means it to be. torch's
// kernel asks for a pinned result there, but ATen's pinned allocation takes CUDA's allocator
// whenever the process has CUDA (GetCPUAllocatorMaybePinned in EmptyTensor.cpp), even beside an
// SDK device; the SDK does not know CUDA's blocks and copies into them synchronously, so on a
// machine with a GPU `emu_tensor.to("cpu", non_blocking=True)` blocked (docs/device-sdk.md,
// "Where torch still prefers CUDA"). Every other conversion is torch's own kernel.
#include "sdk/registration.h"

#include <torchbridge/pinned_host.h>

#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                   std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<at::MemoryFormat> memory_format) {
  // torch's kernel pins exactly here: non_blocking, from an accelerator, to a strided CPU tensor.
  // An explicit pin_memory stays torch's business, as do layouts torch converts itself.
  const bool queued_to_host = non_blocking && device.has_value() && device->is_cpu() && !pin_memory.has_value() &&
                              self.layout() == at::kStrided && layout.value_or(at::kStrided) == at::kStrided &&
                              !self.is_quantized();
  if (!queued_to_host) {
    return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
  }
  // The result's layout as torch's kernel chooses it (empty_like's: dense strides kept, others made
  // dense, or `memory_format`), worked out on the meta device, which allocates nothing.
  const at::Tensor laid_out =
      at::empty_like(self, self.options().dtype(dtype.value_or(self.scalar_type())).device(at::kMeta),
                     memory_format.value_or(at::MemoryFormat::Preserve));
  // Dense, so pinned_host_like keeps these strides.
  at::Tensor result = pinned_host_like(laid_out, c10::DeviceType::PrivateUse1);
  result.copy_(self, /*non_blocking=*/true);
  return result;
}

}  // namespace

void register_to_copy() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("_to_copy", TORCH_FN(to_copy));
}

}  // namespace torchbridge::sdk

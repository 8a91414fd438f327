// Convolution on SDK devices. torch routes convolutions of devices it does not know to
// convolution_overrideable / convolution_backward_overrideable, whose default kernels raise, so
// the boxed fallback never sees them. These kernels run torch's CPU convolution on host copies,
// and lay their results out as torch predicts for such a device, not as the CPU kernel did.
#include "sdk/registration.h"

#include "sdk/fallback.h"

#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::sdk {
namespace {

at::Tensor to_host(const at::Tensor& t) { return t.defined() ? t.cpu() : t; }

// `host_result` on the device in the memory format torch's fake tensors give a convolution of
// this backend (ConvBackend::Overrideable): what torch.compile traces with. The CPU kernel's own
// format (channels-last for a channels-last weight) made a compiled graph's view of the result
// fail ("view size is not compatible with input tensor's size and stride").
at::Tensor on_device_as_torch_predicts(const at::Tensor& host_result, const at::Tensor& input,
                                       const at::Tensor& weight) {
  if (!host_result.defined()) return host_result;
  const at::MemoryFormat format =
      at::native::_determine_backend_memory_format(input, weight, at::native::ConvBackend::Overrideable);
  const bool fits = (format == at::MemoryFormat::ChannelsLast && host_result.dim() == 4) ||
                    (format == at::MemoryFormat::ChannelsLast3d && host_result.dim() == 5);
  return host_result.to(input.device()).contiguous(fits ? format : at::MemoryFormat::Contiguous);
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  check_tensors_on_one_device("aten::convolution_overrideable", {input, weight, bias.value_or(at::Tensor())});
  note_cpu_fallback("aten::convolution_overrideable");
  const std::optional<at::Tensor> host_bias = bias.has_value() ? std::optional(to_host(*bias)) : std::nullopt;
  return on_device_as_torch_predicts(at::convolution(to_host(input), to_host(weight), host_bias, stride, padding,
                                                    dilation, transposed, output_padding, groups),
                                     input, weight);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  check_tensors_on_one_device("aten::convolution_backward_overrideable", {grad_output, input, weight});
  note_cpu_fallback("aten::convolution_backward_overrideable");
  const std::vector<int64_t> bias_sizes = {weight.size(transposed ? 1 : 0) * (transposed ? groups : 1)};
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(to_host(grad_output), to_host(input), to_host(weight), bias_sizes, stride, padding,
                               dilation, transposed, output_padding, groups, output_mask);
  // torch's fake convolution_backward lays out the input and weight gradients as the forward
  // output, and the bias gradient as it comes.
  return {on_device_as_torch_predicts(grad_input, input, weight),
          on_device_as_torch_predicts(grad_weight, input, weight),
          grad_bias.defined() ? grad_bias.to(input.device()) : grad_bias};
}

}  // namespace

void register_convolution() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("convolution_overrideable", TORCH_FN(convolution));
  library->impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
}

}  // namespace torchbridge::sdk

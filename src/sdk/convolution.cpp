// Convolution on SDK devices. torch routes convolutions of devices it does not know to
// convolution_overrideable / convolution_backward_overrideable, whose default kernels raise, so
// the boxed fallback never sees them. These kernels run torch's CPU convolution on host copies.
#include "sdk/registration.h"

#include "sdk/fallback.h"

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

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  check_tensors_on_one_device("aten::convolution_overrideable", {input, weight, bias.value_or(at::Tensor())});
  note_cpu_fallback("aten::convolution_overrideable");
  const std::optional<at::Tensor> host_bias = bias.has_value() ? std::optional(to_host(*bias)) : std::nullopt;
  return at::convolution(to_host(input), to_host(weight), host_bias, stride, padding, dilation, transposed,
                         output_padding, groups)
      .to(input.device());
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
  const auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
  return {back(grad_input), back(grad_weight), back(grad_bias)};
}

}  // namespace

void register_convolution() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("convolution_overrideable", TORCH_FN(convolution));
  library->impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
}

}  // namespace torchbridge::sdk

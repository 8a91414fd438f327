// native_dropout on SDK devices. Its schema takes no generator (the CPU and CUDA kernels draw from
// their device's default one), so the boxed CPU fallback, which hands random operators the SDK
// device's generator through their Generator argument (cpu_fallback.cpp), ran it on the CPU's
// default generator: dropout on emu ignored torch.emu.manual_seed, consumed the CPU's random
// numbers, and was not replayed by torch.utils.checkpoint's device-state restore. This kernel is
// the CPU kernel's arithmetic (a boolean mask from bernoulli_(1 - p), output = input * mask *
// 1 / (1 - p)) made of operators on the device, whose bernoulli_ gets the device's generator.
#include "sdk/registration.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

namespace torchbridge::sdk {
namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input)};  // as the CPU kernel returns it
  const auto as_bool = input.options().dtype(at::kBool);
  if (!train.value_or(true)) return {input.clone(), at::ones_like(input, as_bool)};
  const double keep = 1.0 - p;
  const double scale = keep == 0.0 ? 0.0 : 1.0 / keep;  // p == 1: every element dropped, no division by zero
  at::Tensor mask = at::empty_like(input, as_bool);
  mask.bernoulli_(keep);
  return {input.mul(mask).mul_(scale), mask};
}

}  // namespace

void register_dropout() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace torchbridge::sdk

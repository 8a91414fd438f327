// Batch normalisation on SDK devices. native_batch_norm updates running_mean and running_var in
// place when training, but its schema does not mark them as written, so the boxed CPU fallback
// (which copies back only arguments the schema marks) ran the update on host copies and dropped
// it: a model's running statistics silently never moved. This kernel runs torch's CPU kernel on
// host copies and writes the statistics back.
#include "sdk/registration.h"

#include "sdk/fallback.h"

#include <ATen/ops/native_batch_norm.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

std::optional<at::Tensor> to_host(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? std::optional<at::Tensor>(t->cpu()) : std::nullopt;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  const auto or_none = [](const std::optional<at::Tensor>& t) { return t.value_or(at::Tensor()); };
  check_tensors_on_one_device("aten::native_batch_norm", {input, or_none(weight), or_none(bias), or_none(running_mean),
                                                           or_none(running_var)});
  note_cpu_fallback("aten::native_batch_norm");
  const auto host_mean = to_host(running_mean), host_var = to_host(running_var);
  auto [output, save_mean, save_invstd] = at::native_batch_norm(input.cpu(), to_host(weight), to_host(bias), host_mean,
                                                                host_var, training, momentum, eps);
  if (training && host_mean) running_mean->copy_(*host_mean);
  if (training && host_var) running_var->copy_(*host_var);
  const c10::Device device = input.device();
  return {output.to(device), save_mean.to(device), save_invstd.to(device)};
}

}  // namespace

void register_batch_norm() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("native_batch_norm", TORCH_FN(native_batch_norm));
}

}  // namespace torchbridge::sdk

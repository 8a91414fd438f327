// Autocast for SDK devices: the same lower-precision, fp32, fp32-with-dtype and promote operator
// lists CUDA autocast uses (torch publishes them as AT_FORALL_* macros for out-of-tree devices).
#include "sdk/registration.h"

#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

// Like CUDA: binary_cross_entropy is unsafe in reduced precision, so autocast refuses it.
at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. Use "
              "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss instead, "
              "which are safe to autocast.");
}

}  // namespace

void register_autocast() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  torch::Library& m = *library;  // the KERNEL_* macros register through `m`
  using namespace at;               // ...and name ATen types unqualified
#define TB_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TB_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TB_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TB_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(TB_LOWER_PRECISION)
  AT_FORALL_FP32(TB_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TB_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TB_PROMOTE)
#undef TB_LOWER_PRECISION
#undef TB_FP32
#undef TB_FP32_SET_OPT_DTYPE
#undef TB_PROMOTE
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_banned));

  // Every other operator passes through autocast untouched.
  static auto* passthrough =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  passthrough->fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace torchbridge::sdk

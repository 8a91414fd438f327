#include "validation/comparison.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>

namespace torchbridge::validation {

Comparison compare(const at::Tensor& result, const at::Tensor& reference) {
  Comparison out;
  out.elements = reference.numel();
  if (out.elements == 0) return out;
  const at::Tensor r = result.detach().to(at::kDouble).flatten();
  const at::Tensor ref = reference.detach().to(at::kDouble).flatten();
  const at::Tensor diff = r - ref;
  // All six reductions in one tensor, read with one host sync: the validator compares dozens of
  // small tensors per backend, where per-scalar reads would cost more than the arithmetic.
  // max() and norm() propagate NaN, so a NaN anywhere taints every metric and fails within().
  const at::Tensor reductions =
      at::stack({diff.abs().max(), ref.abs().max(), diff.norm(), ref.norm(), r.norm(), (r * ref).sum()});
  const double* v = reductions.const_data_ptr<double>();
  const double scale = v[1], result_norm = v[4], dot = v[5];
  out.metrics.max_abs_error = v[0];
  out.error_norm = v[2];
  out.reference_norm = v[3];
  out.metrics.max_rel_error = scale > 0 ? out.metrics.max_abs_error / scale
                              : out.metrics.max_abs_error == 0 ? 0.0
                                                               : INFINITY;
  out.metrics.rel_l2_error = out.reference_norm > 0 ? out.error_norm / out.reference_norm
                             : out.error_norm == 0 ? 0.0
                                                   : INFINITY;
  // Two zero tensors point the same way; a zero against a non-zero one does not.
  out.metrics.cosine_similarity = result_norm * out.reference_norm == 0
                                      ? (result_norm == out.reference_norm ? 1.0 : 0.0)
                                      : dot / (result_norm * out.reference_norm);
  return out;
}

bool within(const Comparison& comparison, const Bound& tolerance) {
  // The norm of the error, not its largest element: where a low-precision run flips the side of
  // a ReLU or max-pool for one element, that element's gradient differs completely while the
  // tensor as a whole is right. atol scales with sqrt(n) so it means "per element" on average.
  // Written so that NaN fails both tests.
  const double allowed = tolerance.atol * std::sqrt(static_cast<double>(comparison.elements)) +
                         tolerance.rtol * comparison.reference_norm;
  return comparison.error_norm <= allowed && comparison.metrics.cosine_similarity >= tolerance.min_cosine;
}

OutputCheck check_output(const at::Tensor& result, const at::Tensor& reference, Precision precision) {
  TORCH_CHECK_VALUE(result.sizes() == reference.sizes(), "result has shape ", result.sizes(),
                    ", its reference has shape ", reference.sizes());
  const Comparison comparison = compare(result, reference);
  return {comparison.metrics, within(comparison, spec_of(precision).output)};
}

bool identical(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous().cpu(), y = b.contiguous().cpu();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace torchbridge::validation

#include "validation/comparison.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace torchbridge::validation {
namespace {

// atol * sqrt(n): the part of the allowed error norm that does not scale with the reference.
double absolute_allowance(const Comparison& comparison, const Bound& tolerance) {
  return tolerance.atol * std::sqrt(static_cast<double>(comparison.elements));
}

// error / size, where a zero size makes any error infinitely large (and none zero), and NaN in
// either stays NaN: a NaN result or reference must read as unknown, not as "infinitely wrong".
double relative(double error, double size) {
  if (std::isnan(error) || std::isnan(size)) return std::numeric_limits<double>::quiet_NaN();
  if (size > 0) return error / size;
  return error == 0 ? 0.0 : std::numeric_limits<double>::infinity();
}

// float64 values to measure: a complex tensor's real and imaginary parts side by side (a cast to
// double kept the real part only, so an imaginary part 1.5x too large passed).
at::Tensor measurable(const at::Tensor& tensor) {
  const at::Tensor detached = tensor.detach();
  if (detached.is_complex()) return at::view_as_real(detached.to(at::kComplexDouble).contiguous()).flatten();
  return detached.to(at::kDouble).flatten();
}

}  // namespace

Comparison compare(const at::Tensor& result, const at::Tensor& reference) {
  Comparison out;
  out.elements = reference.numel();
  out.exact = !at::isFloatingType(reference.scalar_type()) && !reference.is_complex();
  if (out.elements == 0) return out;
  const at::Tensor r = measurable(result);
  const at::Tensor ref = measurable(reference);
  if (out.exact) out.differing = (r != ref).sum().item<int64_t>();
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
  out.metrics.max_rel_error = relative(out.metrics.max_abs_error, scale);
  out.metrics.rel_l2_error = relative(out.error_norm, out.reference_norm);
  // Two zero tensors point the same way; a zero against a non-zero one does not.
  out.metrics.cosine_similarity = result_norm * out.reference_norm == 0
                                      ? (result_norm == out.reference_norm ? 1.0 : 0.0)
                                      : dot / (result_norm * out.reference_norm);
  return out;
}

bool within(const Comparison& comparison, const Bound& tolerance, double noise_rms) {
  if (comparison.exact) return comparison.differing == 0;
  // The norm of the error, not its largest element: where a low-precision run flips the side of
  // a ReLU or max-pool for one element, that element's gradient differs completely while the
  // tensor as a whole is right. atol scales with sqrt(n) so it means "per element" on average.
  // Written so that NaN fails.
  if (!(comparison.error_norm <= allowed_error_norm(comparison, tolerance, noise_rms))) return false;
  return !direction_is_checked(comparison, tolerance) ||
         comparison.metrics.cosine_similarity >= tolerance.min_cosine;
}

double allowed_error_norm(const Comparison& comparison, const Bound& tolerance, double noise_rms) {
  if (comparison.exact) return 0;
  const double allowed = absolute_allowance(comparison, tolerance) + tolerance.rtol * comparison.reference_norm;
  if (direction_is_checked(comparison, tolerance) || !(noise_rms > 0)) return allowed;
  return allowed + tolerance.rtol * noise_rms * std::sqrt(static_cast<double>(comparison.elements));
}

bool direction_is_checked(const Comparison& comparison, const Bound& tolerance) {
  // A reference no larger than the absolute tolerance is rounding noise (a gradient that is zero
  // in exact arithmetic, such as a bias just before batch norm, measured 8.9e-16 in float64): its
  // direction means nothing, and the error norm alone decides, as torch.testing's atol does.
  return comparison.reference_norm > absolute_allowance(comparison, tolerance);
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

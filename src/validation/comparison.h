#pragma once
// Measuring one result against its reference, in float64.

#include <torchbridge/precision.h>
#include <torchbridge/validation/validator.h>

namespace torchbridge::validation {

struct Comparison {
  Metrics metrics;
  double error_norm = 0;      // ||result - reference||
  double reference_norm = 0;  // ||reference||
  int64_t elements = 0;
  // Integer and boolean references (token ids, masks, counts) are compared for equality: no
  // rounding makes an id off by 5 right, which a norm-relative bound let through.
  bool exact = false;
  int64_t differing = 0;  // exact comparisons: how many elements differ
};

// Shapes must match (the caller checks). Non-finite values make every metric NaN-tainted, so a
// comparison involving them never passes. Complex values are compared as (real, imaginary) pairs.
Comparison compare(const at::Tensor& result, const at::Tensor& reference);
// Exact comparisons: no element differs. Others: ||result - reference|| <= allowed_error_norm
// and, where direction_is_checked, cosine >= min_cosine. noise_rms: see allowed_error_norm.
bool within(const Comparison& comparison, const Bound& bound, double noise_rms = 0);
// atol * sqrt(n) + rtol * ||reference||, and, for a reference that is rounding noise (the
// direction is not checked), rtol * noise_rms * sqrt(n) more: such a reference (the gradient of a
// bias just before batch norm, zero in exact arithmetic) is what is left of values that cancel,
// and on another backend its size follows the size of those values, not the absolute tolerance
// (fp32 on the CPU left 7e-7 where atol allowed 3e-7). noise_rms is their size per element (the
// caller passes the root mean square of the model's largest gradient); 0 for outputs.
double allowed_error_norm(const Comparison& comparison, const Bound& bound, double noise_rms = 0);
// Whether the reference is larger than the absolute tolerance, so that its direction means something.
bool direction_is_checked(const Comparison& comparison, const Bound& bound);
// Bitwise equality of values, dtypes and shapes (NaNs compare by bits, so a NaN is "equal" to itself).
bool identical(const at::Tensor& a, const at::Tensor& b);

}  // namespace torchbridge::validation

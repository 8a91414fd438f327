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
};

// Shapes must match (the caller checks). Non-finite values make every metric NaN-tainted, so a
// comparison involving them never passes.
Comparison compare(const at::Tensor& result, const at::Tensor& reference);
// ||result - reference|| <= allowed_error_norm and, where direction_is_checked, cosine >= min_cosine.
bool within(const Comparison& comparison, const Bound& bound);
// atol * sqrt(n) + rtol * ||reference||.
double allowed_error_norm(const Comparison& comparison, const Bound& bound);
// Whether the reference is larger than the absolute tolerance, so that its direction means something.
bool direction_is_checked(const Comparison& comparison, const Bound& bound);
// Bitwise equality of values, dtypes and shapes (NaNs compare by bits, so a NaN is "equal" to itself).
bool identical(const at::Tensor& a, const at::Tensor& b);

}  // namespace torchbridge::validation

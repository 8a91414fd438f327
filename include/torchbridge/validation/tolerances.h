#pragma once
// How far a backend's result may be from the reference, per compute precision: one table, used by
// the validator, printed by `torchbridge validate`, and documented in docs/validation.md.

#include <string>
#include <vector>

namespace torchbridge::validation {

// A comparison passes when ||result - reference|| <= atol * sqrt(n) + rtol * ||reference|| (L2
// norms over all n elements) and the cosine similarity of the two is at least min_cosine. Norms
// rather than element-by-element bounds: values near zero (where every low-precision format's
// relative error explodes) and single elements on the other side of a ReLU or max-pool do not
// fail results that are right as a whole. Max abs/rel errors are reported alongside.
struct Bound {
  double atol = 0;
  double rtol = 0;
  double min_cosine = 0;
};

// Gradients get their own, wider bound in low precision: a run that rounds a pre-activation to
// the other side of a ReLU or max-pool kink changes that element's whole gradient contribution
// (not a rounding error but a different branch), and with small batches one such flip moves a
// weight gradient by 10-20% (measured on the built-in MLP in fp16). Outputs are continuous there.
struct Tolerance {
  std::string precision;  // "fp64", "fp32", "tf32", "bf16", "fp16", "fp8"
  Bound output;
  Bound gradient;
};

// Every row of the table, highest precision first.
const std::vector<Tolerance>& tolerance_table();
// The row for a precision name; unknown names raise listing the valid ones.
const Tolerance& tolerance_for(const std::string& precision);

}  // namespace torchbridge::validation

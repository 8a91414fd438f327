#pragma once
// The precisions TorchBridge computes in, as one typed table: what each computes in, what it keeps
// parameters in, and how far a whole model's result may be from a float64 reference. The
// validator and the portability run read this table; the precision policy builds on it. Names
// ("fp32", "bf16", ...) appear only where users type them or reports print them.

#include <c10/core/ScalarType.h>

#include <string>
#include <string_view>
#include <vector>

namespace torchbridge {

enum class Precision { kFp64, kFp32, kTf32, kBf16, kFp16, kFp8 };

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

struct PrecisionSpec {
  Precision precision;
  const char* name;          // as users type it: "fp64", "fp32", "tf32", "bf16", "fp16", "fp8"
  c10::ScalarType compute;   // the dtype arithmetic runs in
  c10::ScalarType storage;   // the dtype parameters are held in (fp8: weight-only float8_e4m3fn)
  bool tf32_matmuls;         // float32 tensors whose matmuls and convolutions run in TF32
  // Gradients get their own, wider bound in low precision: a run that rounds a pre-activation to
  // the other side of a ReLU or max-pool kink changes that element's whole gradient contribution
  // (not a rounding error but a different branch), and with small batches one such flip moves a
  // weight gradient by 10-20% (measured on the built-in MLP in fp16). Outputs are continuous there.
  Bound output;
  Bound gradient;
};

// Every row, highest precision first.
const std::vector<PrecisionSpec>& precision_table();
const PrecisionSpec& spec_of(Precision precision);
const char* name_of(Precision precision);
// The precision a user named; anything else raises c10::ValueError listing the valid names.
Precision parse_precision(std::string_view name);
// Also accepts torch's name of the dtype a plain floating-point precision computes in ("float64",
// "float32", "float16", "bfloat16"), for options where users may type either spelling (the
// validator's and checkpoint convert's --dtype). Configuration files keep the one spelling.
Precision parse_precision_or_dtype_name(std::string_view name);

}  // namespace torchbridge

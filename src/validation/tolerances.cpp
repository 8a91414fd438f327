#include <torchbridge/validation/tolerances.h>

#include <c10/util/Exception.h>

namespace torchbridge::validation {

// Whole-model errors, not single-op ones: a few layers of matmuls, normalisations and softmax
// accumulate many roundings of the format's unit roundoff (fp32 6e-8, tf32 and fp16 5e-4, bf16
// 4e-3, fp8 e4m3 6e-2). Each rtol (a relative L2 error) is roughly 10x the errors measured on the
// built-in models (docs/validation.md lists them); each cosine bound rejects a result whose
// direction is off even when its size is within bounds.
const std::vector<Tolerance>& tolerance_table() {
  static const std::vector<Tolerance> table = {
      // precision  output: atol, rtol, min cosine    gradient: atol, rtol, min cosine
      {"fp64", {1e-12, 1e-10, 1.0 - 1e-12}, {1e-12, 1e-10, 1.0 - 1e-12}},
      {"fp32", {1e-7, 1e-5, 1.0 - 1e-6}, {1e-7, 1e-4, 1.0 - 1e-6}},
      {"tf32", {1e-5, 2e-3, 1.0 - 1e-4}, {1e-5, 5e-2, 0.998}},
      {"fp16", {1e-5, 5e-3, 1.0 - 1e-4}, {1e-5, 0.25, 0.97}},
      {"bf16", {1e-4, 3e-2, 1.0 - 1e-3}, {1e-4, 0.25, 0.97}},
      {"fp8", {1e-3, 0.15, 0.98}, {1e-3, 0.5, 0.9}},
  };
  return table;
}

const Tolerance& tolerance_for(const std::string& precision) {
  std::string valid;
  for (const auto& row : tolerance_table()) {
    if (row.precision == precision) return row;
    valid += (valid.empty() ? "" : ", ") + row.precision;
  }
  TORCH_CHECK_VALUE(false, "unknown precision '", precision, "': expected one of ", valid);
}

}  // namespace torchbridge::validation

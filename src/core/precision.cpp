#include <torchbridge/precision.h>

#include <torchbridge/device_info.h>

#include <c10/util/Exception.h>

#include <string>
#include <string_view>
#include <vector>

namespace torchbridge {

// The bounds are whole-model errors, not single-op ones: a few layers of matmuls, normalisations
// and softmax accumulate many roundings of the format's unit roundoff (fp32 6e-8, tf32 and fp16
// 5e-4, bf16 4e-3, fp8 e4m3 6e-2). Each rtol (a relative L2 error) is roughly 10x the errors
// measured on the built-in models (docs/validation.md lists them); each cosine bound rejects a
// result whose direction is off even when its size is within bounds. fp8 is weight-only: its
// arithmetic runs in bfloat16 (CPUs have no fp8 matmul).
const std::vector<PrecisionSpec>& precision_table() {
  using P = Precision;
  static const std::vector<PrecisionSpec> table = {
      // precision, name, compute, storage, tf32   output: atol, rtol, min cosine   gradient: atol, rtol, min cosine
      {P::kFp64, "fp64", at::kDouble, at::kDouble, false, {1e-12, 1e-10, 1.0 - 1e-12}, {1e-12, 1e-10, 1.0 - 1e-12}},
      {P::kFp32, "fp32", at::kFloat, at::kFloat, false, {1e-7, 1e-5, 1.0 - 1e-6}, {1e-7, 1e-4, 1.0 - 1e-6}},
      {P::kTf32, "tf32", at::kFloat, at::kFloat, true, {1e-5, 2e-3, 1.0 - 1e-4}, {1e-5, 5e-2, 0.998}},
      {P::kFp16, "fp16", at::kHalf, at::kHalf, false, {1e-5, 5e-3, 1.0 - 1e-4}, {1e-5, 0.25, 0.97}},
      {P::kBf16, "bf16", at::kBFloat16, at::kBFloat16, false, {1e-4, 3e-2, 1.0 - 1e-3}, {1e-4, 0.25, 0.97}},
      {P::kFp8, "fp8", at::kBFloat16, at::kFloat8_e4m3fn, false, {1e-3, 0.15, 0.98}, {1e-3, 0.5, 0.9}},
  };
  return table;
}

const PrecisionSpec& spec_of(Precision precision) {
  for (const auto& row : precision_table()) {
    if (row.precision == precision) return row;
  }
  TORCH_CHECK(false, "precision ", static_cast<int>(precision), " has no row in the precision table");
}

const char* name_of(Precision precision) { return spec_of(precision).name; }

Precision parse_precision(std::string_view name) {
  std::string valid;
  for (const auto& row : precision_table()) {
    if (row.name == name) return row.precision;
    valid += (valid.empty() ? "" : ", ") + std::string(row.name);
  }
  TORCH_CHECK_VALUE(false, "unknown precision '", name, "': expected one of ", valid);
}

Precision parse_precision_or_dtype_name(std::string_view name) {
  std::string valid;
  for (const auto& row : precision_table()) {
    if (row.name == name) return row.precision;
    // tf32 and fp8 compute in a dtype another row names (float32, bfloat16): no dtype names them.
    if (row.tf32_matmuls || row.compute != row.storage) continue;
    const std::string torch_name = dtype_name(row.compute);  // "float32", as torch.float32 prints
    if (torch_name == name) return row.precision;
    valid += (valid.empty() ? "" : ", ") + torch_name;
  }
  try {
    return parse_precision(name);
  } catch (const c10::ValueError& error) {
    TORCH_CHECK_VALUE(false, error.msg(), " (or torch's dtype names ", valid, ")");
  }
}

}  // namespace torchbridge

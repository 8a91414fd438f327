#include <torchbridge/checkpoint/safetensors.h>

#include <c10/util/Exception.h>

#include <array>
#include <string>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

struct DtypeName {
  const char* name;
  c10::ScalarType dtype;
};

// Every safetensors dtype torch has an element type for. F4 is torch's float4_e2m1fn_x2, two values
// a byte; the F6 types have none and are refused by name.
constexpr std::array<DtypeName, 20> kDtypes = {{
    {"BOOL", c10::ScalarType::Bool},         {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},           {"I16", c10::ScalarType::Short},
    {"U16", c10::ScalarType::UInt16},        {"I32", c10::ScalarType::Int},
    {"U32", c10::ScalarType::UInt32},        {"I64", c10::ScalarType::Long},
    {"U64", c10::ScalarType::UInt64},        {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},     {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},        {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2}, {"C64", c10::ScalarType::ComplexFloat},
    {"F8_E4M3FNUZ", c10::ScalarType::Float8_e4m3fnuz}, {"F8_E5M2FNUZ", c10::ScalarType::Float8_e5m2fnuz},
    {"F8_E8M0", c10::ScalarType::Float8_e8m0fnu}, {"F4", c10::ScalarType::Float4_e2m1fn_x2},
}};

}  // namespace

c10::ScalarType dtype_from_safetensors(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return entry.dtype;
  }
  std::string valid;
  for (const auto& entry : kDtypes) valid += std::string(valid.empty() ? "" : ", ") + entry.name;
  TORCH_CHECK_VALUE(false, "unsupported dtype '", name, "' (supported: ", valid, ")");
}

bool holds_dtype(c10::ScalarType dtype) {
  for (const auto& entry : kDtypes) {
    if (dtype == entry.dtype) return true;
  }
  return false;
}

std::string safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& entry : kDtypes) {
    if (dtype == entry.dtype) return entry.name;
  }
  TORCH_CHECK_VALUE(false, "dtype ", c10::toString(dtype), " cannot be stored in safetensors");
}

int64_t values_per_element(c10::ScalarType dtype) { return dtype == c10::ScalarType::Float4_e2m1fn_x2 ? 2 : 1; }

std::vector<int64_t> safetensors_shape(c10::ScalarType dtype, c10::IntArrayRef sizes) {
  std::vector<int64_t> shape = sizes.vec();
  if (values_per_element(dtype) == 1) return shape;
  TORCH_CHECK_VALUE(!shape.empty(), "a 0-dim ", c10::toString(dtype), " tensor cannot be stored in safetensors, whose ",
                    safetensors_dtype_name(dtype), " shape counts its values along a last dimension; reshape it to [1]");
  shape.back() *= values_per_element(dtype);
  return shape;
}

}  // namespace torchbridge::checkpoint

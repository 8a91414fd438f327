#include <torchbridge/checkpoint/safetensors.h>

#include <c10/util/Exception.h>

#include <array>
#include <string>

namespace torchbridge::checkpoint {
namespace {

struct DtypeName {
  const char* name;
  c10::ScalarType dtype;
};

// Every safetensors dtype with a whole-byte torch element type. The sub-byte F4 and F6 types
// (torch's float4_e2m1fn_x2 packs two values a byte) are refused by name.
constexpr std::array<DtypeName, 19> kDtypes = {{
    {"BOOL", c10::ScalarType::Bool},         {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},           {"I16", c10::ScalarType::Short},
    {"U16", c10::ScalarType::UInt16},        {"I32", c10::ScalarType::Int},
    {"U32", c10::ScalarType::UInt32},        {"I64", c10::ScalarType::Long},
    {"U64", c10::ScalarType::UInt64},        {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},     {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},        {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2}, {"C64", c10::ScalarType::ComplexFloat},
    {"F8_E4M3FNUZ", c10::ScalarType::Float8_e4m3fnuz}, {"F8_E5M2FNUZ", c10::ScalarType::Float8_e5m2fnuz},
    {"F8_E8M0", c10::ScalarType::Float8_e8m0fnu},
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

}  // namespace torchbridge::checkpoint

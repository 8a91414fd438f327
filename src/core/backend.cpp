#include <torchbridge/backend.h>
#include <torchbridge/version.h>

#include "core/to_lower.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

namespace torchbridge {

std::string to_string(OptLevel level) {
  switch (level) {
    case OptLevel::O0: return "O0";
    case OptLevel::O1: return "O1";
    case OptLevel::O2: return "O2";
    case OptLevel::O3: return "O3";
  }
  TORCH_CHECK(false, "invalid OptLevel value ", static_cast<int>(level));
}

OptLevel parse_opt_level(const std::string& text) {
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper == "O0") return OptLevel::O0;
  if (upper == "O1") return OptLevel::O1;
  if (upper == "O2") return OptLevel::O2;
  if (upper == "O3") return OptLevel::O3;
  TORCH_CHECK_VALUE(false, "unknown optimization level '", text, "'; expected one of O0, O1, O2, O3");
}

std::string to_string(AvailabilityStatus status) {
  switch (status) {
    case AvailabilityStatus::kAvailable: return "available";
    case AvailabilityStatus::kNotCompiled: return "not_compiled";
    case AvailabilityStatus::kNoDevice: return "no_device";
    case AvailabilityStatus::kDriverError: return "driver_error";
    case AvailabilityStatus::kNotRegistered: return "not_registered";
    case AvailabilityStatus::kPythonOnly: return "python_only";
  }
  TORCH_CHECK(false, "invalid AvailabilityStatus value ", static_cast<int>(status));
}

void Backend::check_available() const {
  const Availability availability = this->availability();
  TORCH_CHECK(availability.available(), "backend '", name(), "' is not available: ",
              availability.reason);
}

void Backend::check_device_index(int index) const {
  check_available();
  const int count = device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < count, "device index ", index,
                    " is out of range for backend '", name(), "', which has ", count,
                    count == 1 ? " device (valid index: 0)"
                               : " devices (valid indices: 0.." + std::to_string(count - 1) + ")");
}

c10::Device Backend::device(int index) const {
  check_device_index(index);
  return c10::Device(device_type(), static_cast<c10::DeviceIndex>(index));
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    case c10::ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case c10::ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case c10::ScalarType::ComplexHalf: return "complex32";
    // The rest (qint8, quint4x2, uint16, float8_e8m0fnu, bits8, int4, ...) are c10's names in
    // lower case, as torch prints them; c10's own spelling (QInt8, UInt16) is not torch's.
    default: return detail::to_lower(c10::toString(dtype));
  }
}

const char* library_version() { return TORCHBRIDGE_VERSION_STRING; }

}  // namespace torchbridge

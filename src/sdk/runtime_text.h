#pragma once
// Text a vendor runtime hands over: its error messages and the strings of tb_device_properties.
// A runtime may give bytes in its locale's encoding (a driver's message in Latin-1), which Python's
// errors and JSON text refuse (a UnicodeDecodeError, nlohmann's type_error 316, in place of the
// message), or fill a property field to its last byte with no NUL. Internal to the SDK glue.

#include <cstddef>
#include <string>

namespace torchbridge::sdk {

// `text` (NULL: "") as valid UTF-8, each byte that is not part of a UTF-8 sequence written as the
// four characters \xNN; read up to its NUL or `limit` bytes, whichever comes first.
std::string runtime_message(const char* text, size_t limit = 4096);

// Makes the char[size] `field` a NUL-terminated UTF-8 string in place: a field filled to its end is
// cut at size - 1 bytes, and a byte that is not part of a UTF-8 sequence becomes '?'.
void make_field_text(char* field, size_t size);

}  // namespace torchbridge::sdk

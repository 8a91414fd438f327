#include "sdk/runtime_text.h"

#include <cstdio>
#include <cstring>

namespace torchbridge::sdk {
namespace {

bool continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The length of the UTF-8 sequence at `bytes` (at most `remaining` long), 0 when it is not one:
// a stray continuation byte, a cut or overlong sequence, a surrogate or a code point past U+10FFFF.
size_t sequence_length(const unsigned char* bytes, size_t remaining) {
  const unsigned char lead = bytes[0];
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (remaining < length || bytes[1] < low || bytes[1] > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (!continuation(bytes[i])) return 0;
  }
  return length;
}

}  // namespace

std::string runtime_message(const char* text, size_t limit) {
  if (text == nullptr) return {};
  const auto* bytes = reinterpret_cast<const unsigned char*>(text);
  const size_t size = strnlen(text, limit);
  std::string result;
  result.reserve(size);
  for (size_t at = 0; at < size;) {
    const size_t length = sequence_length(bytes + at, size - at);
    if (length == 0) {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02X", bytes[at]);
      result += escaped;
      ++at;
    } else {
      result.append(text + at, length);
      at += length;
    }
  }
  return result;
}

void make_field_text(char* field, size_t size) {
  if (size == 0) return;
  field[size - 1] = '\0';
  auto* bytes = reinterpret_cast<unsigned char*>(field);
  const size_t length = std::strlen(field);
  for (size_t at = 0; at < length;) {
    const size_t sequence = sequence_length(bytes + at, length - at);
    if (sequence == 0) {
      field[at] = '?';
      ++at;
    } else {
      at += sequence;
    }
  }
}

}  // namespace torchbridge::sdk

// How a file torch.save wrote begins, told from its first bytes: the safetensors reader names such
// a file in its refusal, the torch.save reader refuses the legacy form, and `checkpoint convert`
// chooses its reader by them rather than by the file's extension.
#pragma once

#include <cstddef>
#include <cstring>

namespace torchbridge::checkpoint {

// torch.save's format since torch 1.6: a zip archive (its local file header's signature).
inline bool begins_as_zip_archive(const char* bytes, size_t size) {
  return size >= 4 && std::memcmp(bytes, "PK\x03\x04", 4) == 0;
}

// The bytes begins_as_legacy_torch_save needs at most.
inline constexpr size_t kLegacyTorchSaveSignatureBytes = 23;

// The legacy format (torch < 1.6, or _use_new_zipfile_serialization=False) is a bare pickle: the
// PROTO opcode and torch.save's pickle_protocol (2-5), from protocol 4 a FRAME opcode with its
// 8-byte length, then torch.save's magic number as a LONG1. The first two bytes alone also begin
// safetensors files whose header is 640 bytes long (0x0280), which were then refused as legacy
// torch.save files.
inline bool begins_as_legacy_torch_save(const char* bytes, size_t size) {
  static constexpr char kMagicNumber[] = "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
  constexpr size_t kMagicBytes = sizeof kMagicNumber - 1;
  if (size < 2 || bytes[0] != '\x80' || bytes[1] < 2 || bytes[1] > 5) return false;
  const size_t magic_at = bytes[1] >= 4 && size > 2 && bytes[2] == '\x95' ? 2 + 9 : 2;
  return size >= magic_at + kMagicBytes && std::memcmp(bytes + magic_at, kMagicNumber, kMagicBytes) == 0;
}

}  // namespace torchbridge::checkpoint

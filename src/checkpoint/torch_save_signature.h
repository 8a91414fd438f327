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

// The legacy format (torch < 1.6, or _use_new_zipfile_serialization=False) is a bare pickle: the
// PROTO opcode, then torch.save's pickle_protocol (2-5).
inline bool begins_as_pickle(const char* bytes, size_t size) {
  return size >= 2 && bytes[0] == '\x80' && bytes[1] >= 2 && bytes[1] <= 5;
}

}  // namespace torchbridge::checkpoint

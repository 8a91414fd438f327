#include "last_error.h"

#include <cstdint>
#include <cstdio>
#include <utility>

namespace torchbridge::emu {
namespace {

// Thread-local because the contract asks for *this thread's* last failure: two threads failing at
// once must each read their own sentence.
thread_local std::string t_last_error;

}  // namespace

tb_status fail(tb_status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

const char* last_error_message() { return t_last_error.c_str(); }

const char* status_string(int status) {
  switch (status) {
    case TB_SUCCESS: return "success";
    case TB_ERROR_INVALID_VALUE: return "invalid value";
    case TB_ERROR_INVALID_DEVICE: return "invalid device";
    case TB_ERROR_OUT_OF_MEMORY: return "out of memory";
    case TB_ERROR_INVALID_POINTER: return "invalid pointer";
    case TB_ERROR_NOT_READY: return "not ready";
    case TB_ERROR_INVALID_HANDLE: return "invalid handle";
    case TB_ERROR_NOT_SUPPORTED: return "not supported";
    case TB_ERROR_DEVICE_FAILURE: return "device failure";
    case TB_ERROR_UNKNOWN: return "unknown error";
  }
  return "unrecognised tb_status value";
}

std::string pointer_text(const void* pointer) {
  char text[2 + 2 * sizeof(void*) + 1];
  std::snprintf(text, sizeof text, "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(pointer)));
  return text;
}

}  // namespace torchbridge::emu

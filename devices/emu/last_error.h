// Per-thread failure sentences and the names of tb_status values.
#pragma once

#include <torchbridge/sdk/runtime.h>

#include <string>

namespace torchbridge::emu {

// Records `message` as this thread's last failure and returns `status`, so a failing path reads
// `return fail(TB_ERROR_..., "sentence");`.
tb_status fail(tb_status status, std::string message);

// This thread's last failure sentence, "" if there was none. Valid until the next failure on the
// same thread (the text lives in a thread_local string).
const char* last_error_message();

// A fixed description of every status; never NULL, also for values that are no tb_status.
const char* status_string(int status);

// "0x7f12..." for messages that must name a pointer.
std::string pointer_text(const void* pointer);

}  // namespace torchbridge::emu

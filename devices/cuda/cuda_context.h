// The runtime's own state, handed back by the SDK as the `context` argument of every entry.
#pragma once

#include <cstdint>

#include "torchbridge/sdk/runtime.h"

namespace torchbridge::cuda_device {

struct Context {
  // Fixed for the life of the process: the CUDA runtime reads CUDA_VISIBLE_DEVICES once, when it
  // initializes, so the count found by tb_runtime_entry stays valid for index checks.
  int32_t device_count = 0;
};

inline const Context& context_of(void* context) { return *static_cast<const Context*>(context); }

// TB_SUCCESS when 0 <= device < device_count, else TB_ERROR_INVALID_DEVICE with a message naming
// the entry, the index and the valid range.
tb_status check_device_index(const Context& context, const char* entry, int32_t device);

}  // namespace torchbridge::cuda_device

// One copy or fill with its addresses already validated and translated to the runtime's own view.
// memcpy_sync runs it at once; memcpy_async and memset_async queue it on a stream. The injected
// copy faults are applied here, in the one place every byte passes through.
#pragma once

#include <cstddef>

namespace torchbridge::emu {

enum class TransferFault {
  none,
  drop,     // report success, move nothing
  corrupt,  // copy, then flip the middle byte of the destination
};

struct Transfer {
  enum class Kind { copy, move, fill };  // move: source and destination may overlap (device to device)
  Kind kind = Kind::copy;
  void* destination = nullptr;
  const void* source = nullptr;  // unused for fill
  unsigned char fill_value = 0;
  std::size_t bytes = 0;
  TransferFault fault = TransferFault::none;

  void execute() const;
};

}  // namespace torchbridge::emu

#include "transfer.h"

#include <cstring>

namespace torchbridge::emu {

void Transfer::execute() const {
  if (bytes == 0 || fault == TransferFault::drop) return;
  switch (kind) {
    case Kind::copy: std::memcpy(destination, source, bytes); break;
    case Kind::move: std::memmove(destination, source, bytes); break;
    case Kind::fill: std::memset(destination, fill_value, bytes); break;
  }
  if (fault == TransferFault::corrupt) static_cast<unsigned char*>(destination)[bytes / 2] ^= 0xFF;
}

}  // namespace torchbridge::emu

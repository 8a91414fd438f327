#include "fault_injector.h"

namespace torchbridge::emu {

TransferFault FaultInjector::fault_for_copy(tb_memcpy_kind kind, std::size_t bytes) {
  if (bytes < kMinimumFaultyCopyBytes) return TransferFault::none;
  TransferFault fault = TransferFault::none;
  if (mode_ == FaultMode::drop_copy && kind == TB_MEMCPY_HOST_TO_DEVICE) fault = TransferFault::drop;
  if (mode_ == FaultMode::corrupt_copy && kind == TB_MEMCPY_DEVICE_TO_HOST) fault = TransferFault::corrupt;
  if (fault == TransferFault::none) return fault;
  // exchange makes "first" exact even when several threads copy at once.
  return fired_.exchange(true) ? TransferFault::none : fault;
}

}  // namespace torchbridge::emu

// Decides which operation a TORCHBRIDGE_EMU_FAULT mode breaks. The copy faults are one-shot: only
// the first qualifying copy of the process misbehaves, so a test can show that exactly one
// transfer went wrong and everything afterwards is sound.
#pragma once

#include "options.h"
#include "transfer.h"

#include <torchbridge/sdk/runtime.h>

#include <atomic>
#include <cstddef>

namespace torchbridge::emu {

class FaultInjector {
 public:
  // Copies smaller than this are never broken: tiny transfers (scalars, flags) are rarely what a
  // data-integrity check is about, and sparing them keeps the fault aimed at real payloads.
  static constexpr std::size_t kMinimumFaultyCopyBytes = 64;

  explicit FaultInjector(FaultMode mode) : mode_(mode) {}

  // Called once per copy, after the copy has been validated and just before it is run or queued
  // (so the "first" copy is the first in call order, whichever stream it goes to).
  TransferFault fault_for_copy(tb_memcpy_kind kind, std::size_t bytes);

  // With the leak fault, freed device ranges never return to the pool.
  bool freed_memory_returns_to_pool() const { return mode_ != FaultMode::leak; }

 private:
  const FaultMode mode_;
  std::atomic<bool> fired_{false};
};

}  // namespace torchbridge::emu

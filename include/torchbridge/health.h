#pragma once
// A real end-to-end check of one device: allocate, copy a known pattern there, copy it on the
// device, copy it back, compare bit for bit, synchronize. Used by `torchbridge doctor`.

#include <torchbridge/backend.h>

#include <string>

namespace torchbridge {

struct HealthCheckResult {
  bool passed = false;
  std::string detail;        // what was checked, or what went wrong
  double duration_ms = 0.0;  // wall time of the whole check, synchronization included
};

// Never throws for device problems: they are reported as a failed result. `bytes` must be a
// positive multiple of 4 (the pattern is int32 elements); anything else raises c10::ValueError.
// The host holds two copies of the pattern (sent and returned) while it runs.
HealthCheckResult run_health_check(Backend& backend, int index, int64_t bytes = 4 << 20);

}  // namespace torchbridge

#pragma once
// Which backends of a list can share a process, by PyTorch's one-accelerator rule
// (one_accelerator.h) and its single PrivateUse1 slot: an SDK device cannot share one with a native
// accelerator, nor with another SDK device. Names are resolved through the backend registry without
// loading or initialising anything.

#include <string>
#include <vector>

namespace torchbridge {

// Of `backends` (names or aliases), the SDK devices that cannot share a process with the rest:
// every one of them when the list also names a native accelerator or a second SDK device, or when
// this process already holds another SDK device; empty when all can run in one process. Resolves
// names without loading anything.
std::vector<std::string> sdk_devices_needing_own_process(const std::vector<std::string>& backends);

// Raises (ValueError) when `backends` cannot share a process (above), naming the two that clash and
// the way out; `what` is the work, e.g. "validate".
void check_backends_can_share_a_process(const std::vector<std::string>& backends, const std::string& what);

}  // namespace torchbridge

#pragma once
// Which backends of a list can share a process, by PyTorch's one-accelerator rule
// (one_accelerator.h): an SDK device and a native accelerator cannot. Names are resolved through
// the backend registry without loading or initialising anything.

#include <string>
#include <vector>

namespace torchbridge {

// Of `backends` (names or aliases), the SDK devices that cannot share a process with the rest
// because the list also names a native accelerator; empty when all can run in one process.
// Resolves names without loading anything.
std::vector<std::string> sdk_devices_needing_own_process(const std::vector<std::string>& backends);

// Raises (ValueError) when `backends` holds an SDK device and a native accelerator, which cannot
// share a process, naming both and the way out; `what` is the work, e.g. "validate".
void check_backends_can_share_a_process(const std::vector<std::string>& backends, const std::string& what);

}  // namespace torchbridge

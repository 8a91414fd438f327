#pragma once
// The validator's checks on one backend: its runs, their comparisons with the reference,
// determinism, the round trip and device memory.

#include "validation/reference.h"

#include <torchbridge/precision.h>
#include <torchbridge/validation/validator.h>

#include <functional>
#include <future>
#include <string>
#include <vector>

namespace torchbridge {
class Backend;
}

namespace torchbridge::validation {

// Appends the checks of backend `name` (device 0 of `backend`) to `report`. Every device step
// comes before the comparisons, which wait for `reference`; an error of the reference's is
// rethrown, one of the backend's is recorded as a failed "run" check. `progress` is called
// before each step ("run", "determinism and round trip", "compare with the reference", "memory").
void validate_backend(const std::string& name, Backend& backend, const ModelSource& model,
                      const std::vector<at::Tensor>& inputs, const OutputWeights& weights,
                      const std::shared_future<Reference>& reference, Precision precision, ValidationReport& report,
                      const std::function<void(const std::string& step)>& progress);

}  // namespace torchbridge::validation

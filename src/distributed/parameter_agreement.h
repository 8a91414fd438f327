#pragma once
// Every rank of a data-parallel group must hold the same parameters (count, shapes, dtypes, which
// are trained, device type): a different model on one rank would otherwise fail later, somewhere
// inside a collective, or silently average unrelated tensors. Internal to the distributed layer.

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}

namespace torchbridge::distributed {

class ProcessGroup;

// Runs `local_checks`, which throw for what this rank refuses, then ProcessGroup::refuse_together:
// when any rank refused, every rank raises, this one its own exception as it was thrown.
void check_together(ProcessGroup& group, const std::string& who, const std::function<void()>& local_checks);

// Gathers every rank's parameter count, shapes, dtypes, requires_grad flags and device types (as CPU tensors, whatever the
// parameters' device) and raises the same c10::ValueError on every rank when any rank differs
// from rank 0, naming the ranks and the first parameter that differs. `who` starts the message.
void check_same_parameters_on_every_rank(ProcessGroup& group,
                                         const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                         const std::string& who);

}  // namespace torchbridge::distributed

#pragma once
// Validation split across processes: the backends that cannot share this process (an SDK device
// beside a native accelerator; see include/torchbridge/one_accelerator.h), or every non-CPU
// backend when asked to isolate, are validated by `torchbridge validate` in a child process, and
// the reports are merged into one.

#include <torchbridge/validation/validator.h>

#include <string>
#include <vector>

namespace torchbridge::cli {

// Which of `backends` to validate in a child process each: the SDK devices that cannot share a
// process with a native accelerator in the list, or, with `isolate_all`, every backend but the CPU.
std::vector<std::string> backends_for_child_processes(const std::vector<std::string>& backends, bool isolate_all);

// `torchbridge validate --json --backends BACKEND` + `validate_args` in a child process. A child
// that ends without a report yields a report holding one failed "run" check that says how it
// ended (exit code or signal) and its last error line, so a crash is a result, not a lost run.
validation::ValidationReport validate_in_child(const std::string& backend, const std::vector<std::string>& validate_args,
                                               Precision precision);

// One report from parts that each validated some of `backends`: checks, notes and timings in the
// order of `backends`; header (model kind, reference) from the first part that computed one.
validation::ValidationReport merge_reports(const std::vector<validation::ValidationReport>& parts,
                                           const std::vector<std::string>& backends);

}  // namespace torchbridge::cli

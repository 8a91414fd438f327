#include "isolated_validation.h"

#include "child_process.h"

#include <torchbridge/process_isolation.h>
#include <torchbridge/one_accelerator.h>
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>

namespace torchbridge::cli {

std::vector<std::string> backends_for_child_processes(const std::vector<std::string>& backends, bool isolate_all) {
  if (!isolate_all) return sdk_devices_needing_own_process(backends);
  std::vector<std::string> isolated;
  for (const auto& name : backends) {
    if (BackendRegistry::instance().device_type_of(name) != c10::DeviceType::CPU) isolated.push_back(name);
  }
  return isolated;
}

validation::ValidationReport validate_in_child(const std::string& backend, const std::vector<std::string>& validate_args,
                                               Precision precision) {
  std::vector<std::string> args = {"validate", "--json", "--backends", backend};
  args.insert(args.end(), validate_args.begin(), validate_args.end());
  std::string failure;
  try {
    const ChildResult child = run_self(args);
    try {
      return validation::report_from_json(child.out);
    } catch (const std::exception&) {
      failure = "the child process validating it " + child.describe_exit() + " without a report";
      if (const std::string line = child.last_error_line(); !line.empty()) failure += ": " + line;
    }
  } catch (const std::exception& e) {
    failure = std::string("cannot start a child process to validate it: ") + e.what();
  }
  validation::ValidationReport report;
  report.precision = precision;
  report.backends = {backend};
  report.checks.push_back({backend, backend, validation::CheckKind::kRun, "model", false, std::nullopt, failure});
  return report;
}

validation::ValidationReport merge_reports(const std::vector<validation::ValidationReport>& parts,
                                           const std::vector<std::string>& backends) {
  validation::ValidationReport merged;
  merged.backends = backends;
  if (!parts.empty()) {  // every part ran the same precision and training mode
    merged.precision = parts.front().precision;
    merged.checkpointing = parts.front().checkpointing;
  }
  for (const auto& part : parts) {
    // A part from a child that ran (it has a reference) must have trained the same way: a child
    // that missed --checkpointing would make the merged report claim what it did not check.
    TORCH_CHECK(part.reference.empty() || part.checkpointing == merged.checkpointing,
                "a validation part ran ", part.checkpointing ? "with" : "without",
                " checkpointed training, unlike the others");
    if (merged.reference.empty() && !part.reference.empty()) {
      merged.model_kind = part.model_kind;
      merged.reference = part.reference;
      merged.reference_seconds = part.reference_seconds;
    }
  }
  if (merged.reference.empty()) merged.reference = "none (no process computed the reference)";
  for (const auto& backend : backends) {
    for (const auto& part : parts) {
      for (const auto& check : part.checks) {
        if (check.backend == backend) merged.checks.push_back(check);
      }
      for (const auto& timing : part.timings) {
        if (timing.backend == backend) merged.timings.push_back(timing);
      }
      for (const auto& line : part.not_checked) {
        if (line.rfind(backend + ":", 0) == 0) merged.not_checked.push_back(line);
      }
    }
  }
  return merged;
}

}  // namespace torchbridge::cli

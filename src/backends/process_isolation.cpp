#include <torchbridge/process_isolation.h>

#include "core/to_lower.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/registry.h>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <vector>

namespace torchbridge {

namespace {

// The backends of a list, sorted by what they need of a process.
struct ProcessNeeds {
  std::vector<std::string> sdk_devices;  // distinct SDK device names, in list order
  std::string native;                    // the first native accelerator named, "" when none
};

// The registry's name for `name` (an alias of the registered SDK device becomes its name), so that
// one device named two ways counts once.
std::string canonical_name(const std::string& name) {
  const std::string wanted = detail::to_lower(name);
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if (entry.name == wanted || std::find(entry.aliases.begin(), entry.aliases.end(), wanted) != entry.aliases.end()) {
      return entry.name;
    }
  }
  return wanted;
}

ProcessNeeds process_needs(const std::vector<std::string>& backends) {
  ProcessNeeds needs;
  for (const auto& name : backends) {
    const c10::DeviceType type = BackendRegistry::instance().device_type_of(name);
    if (type == c10::DeviceType::PrivateUse1) {
      const std::string device = canonical_name(name);
      if (std::find(needs.sdk_devices.begin(), needs.sdk_devices.end(), device) == needs.sdk_devices.end()) {
        needs.sdk_devices.push_back(device);
      }
    } else if (type != c10::DeviceType::CPU && needs.native.empty()) {
      needs.native = name;
    }
  }
  return needs;
}

// The SDK device holding this process's single PrivateUse1 slot, "" while it is free.
std::string sdk_device_in_this_process() {
  const std::string held = c10::get_privateuse1_backend();
  return held == "privateuseone" ? "" : held;
}

}  // namespace

std::vector<std::string> sdk_devices_needing_own_process(const std::vector<std::string>& backends) {
  const ProcessNeeds needs = process_needs(backends);
  // PyTorch has one PrivateUse1 slot: two SDK devices cannot share a process, nor one and the SDK
  // device this process already holds.
  const std::string held = sdk_device_in_this_process();
  const bool other_held = std::any_of(needs.sdk_devices.begin(), needs.sdk_devices.end(),
                                      [&](const std::string& name) { return !held.empty() && name != held; });
  if (!needs.native.empty() || needs.sdk_devices.size() > 1 || other_held) return needs.sdk_devices;
  return {};
}

void check_backends_can_share_a_process(const std::vector<std::string>& backends, const std::string& what) {
  const auto separate = sdk_devices_needing_own_process(backends);
  if (separate.empty()) return;
  const ProcessNeeds needs = process_needs(backends);
  const std::string way_out = ". Run '" + separate.front() +
                              "' in a process of its own: `torchbridge validate` and `torchbridge portability` do "
                              "this by themselves; from the API, use one process per accelerator.";
  TORCH_CHECK_VALUE(needs.native.empty(), "cannot ", what, " on SDK device '", separate.front(),
                    "' and native accelerator '", needs.native, "' in one process: ", kOneAcceleratorReason, way_out);
  const std::string held = sdk_device_in_this_process();
  const std::string other = needs.sdk_devices.size() > 1 ? needs.sdk_devices[1] : held;
  TORCH_CHECK_VALUE(false, "cannot ", what, " on SDK devices '", separate.front(), "' and '", other,
                    "' in one process: PyTorch has a single PrivateUse1 slot for SDK devices", way_out);
}

}  // namespace torchbridge

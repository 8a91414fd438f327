#include <torchbridge/process_isolation.h>

#include <torchbridge/one_accelerator.h>
#include <torchbridge/registry.h>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace torchbridge {

std::vector<std::string> sdk_devices_needing_own_process(const std::vector<std::string>& backends) {
  std::vector<std::string> sdk_devices;
  bool native = false;
  for (const auto& name : backends) {
    const c10::DeviceType type = BackendRegistry::instance().device_type_of(name);
    if (type == c10::DeviceType::PrivateUse1) sdk_devices.push_back(name);
    native = native || (type != c10::DeviceType::CPU && type != c10::DeviceType::PrivateUse1);
  }
  return native ? sdk_devices : std::vector<std::string>{};
}

void check_backends_can_share_a_process(const std::vector<std::string>& backends, const std::string& what) {
  const auto separate = sdk_devices_needing_own_process(backends);
  if (separate.empty()) return;
  std::string native;
  for (const auto& name : backends) {
    const c10::DeviceType type = BackendRegistry::instance().device_type_of(name);
    if (native.empty() && type != c10::DeviceType::CPU && type != c10::DeviceType::PrivateUse1) native = name;
  }
  TORCH_CHECK_VALUE(false, "cannot ", what, " on SDK device '", separate.front(), "' and native accelerator '", native,
                    "' in one process: ", kOneAcceleratorReason, ". Run '", separate.front(),
                    "' in a process of its own: `torchbridge validate` and `torchbridge portability` do this by "
                    "themselves; from the API, use one process per accelerator.");
}

}  // namespace torchbridge

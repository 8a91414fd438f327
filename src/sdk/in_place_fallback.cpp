#include "sdk/in_place_fallback.h"

#include "sdk/runtime_handle.h"

#include <vector>

namespace torchbridge::sdk {
namespace {

std::vector<bool> addressable;

}  // namespace

void init_host_addressable(int device_count) {
  for (int d = 0; d < device_count; ++d) addressable.push_back(runtime().properties(d).host_addressable != 0);
}

bool host_addressable(c10::DeviceIndex index) {
  return index >= 0 && static_cast<size_t>(index) < addressable.size() && addressable[index];
}

}  // namespace torchbridge::sdk

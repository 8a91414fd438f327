#include "cuda_context.h"

#include <string>

#include "cuda_status.h"

namespace torchbridge::cuda_device {

tb_status check_device_index(const Context& context, const char* entry, int32_t device) {
  if (device >= 0 && device < context.device_count) return TB_SUCCESS;
  return report_error(TB_ERROR_INVALID_DEVICE,
                      std::string(entry) + ": device " + std::to_string(device) +
                          " does not exist (valid: 0.." + std::to_string(context.device_count - 1) +
                          ")");
}

}  // namespace torchbridge::cuda_device

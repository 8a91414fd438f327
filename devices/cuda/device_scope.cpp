#include "device_scope.h"

#include <cuda_runtime_api.h>

#include "cuda_status.h"

namespace torchbridge::cuda_device {

tb_status DeviceScope::enter(int32_t device) {
  if (tb_status status = check_cuda("cudaGetDevice", cudaGetDevice(&previous_));
      status != TB_SUCCESS) {
    return status;
  }
  // Skipping cudaSetDevice when nothing changes keeps the common case to one cheap query.
  if (previous_ == device) return TB_SUCCESS;
  if (tb_status status = check_cuda("cudaSetDevice", cudaSetDevice(device)); status != TB_SUCCESS) {
    return status;
  }
  switched_ = true;
  return TB_SUCCESS;
}

DeviceScope::~DeviceScope() {
  // A destructor cannot report, and the previous device was valid a moment ago: this can only fail
  // if the driver itself has died, which the caller's next CUDA call will report anyway.
  if (switched_) (void)cudaSetDevice(previous_);
}

}  // namespace torchbridge::cuda_device

// Error reporting for the CUDA device runtime: cudaError_t -> tb_status, and the per-thread
// sentence the SDK reads through tb_runtime::last_error_message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "torchbridge/sdk/runtime.h"

namespace torchbridge::cuda_device {

// The tb_status that best describes a CUDA runtime error.
tb_status map_cuda_error(cudaError_t error);

// Records "<call> failed: <cudaGetErrorString> (<cudaGetErrorName>)" as this thread's last error,
// clears CUDA's own per-thread error and returns the mapped status. `error` must not be
// cudaSuccess.
tb_status report_cuda_error(const char* call, cudaError_t error);

// Like report_cuda_error, but with an explicit status and extra detail after the CUDA text
// (used when the generic mapping would be wrong or the message needs numbers).
tb_status report_cuda_error(const char* call, cudaError_t error, tb_status status,
                            const std::string& detail);

// Records a failure found by this runtime itself (bad argument, unknown handle, ...).
tb_status report_error(tb_status status, std::string message);

// TB_ERROR_INVALID_VALUE for a NULL pointer argument: "<entry>: <argument> is NULL".
tb_status report_null_argument(const char* entry, const char* argument);

// Returns TB_SUCCESS, or reports the failure of `call`.
inline tb_status check_cuda(const char* call, cudaError_t error) {
  return error == cudaSuccess ? TB_SUCCESS : report_cuda_error(call, error);
}

// Entries of the tb_runtime table.
const char* status_string(void* context, tb_status status);
const char* last_error_message(void* context);

}  // namespace torchbridge::cuda_device

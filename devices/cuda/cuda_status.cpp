#include "cuda_status.h"

#include <utility>

namespace torchbridge::cuda_device {
namespace {

// One sentence per host thread, as the SDK convention asks: a failure on one thread must not
// overwrite the explanation another thread is about to read.
thread_local std::string last_error;

std::string describe(const char* call, cudaError_t error) {
  return std::string(call) + " failed: " + cudaGetErrorString(error) + " (" +
         cudaGetErrorName(error) + ")";
}

}  // namespace

tb_status map_cuda_error(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return TB_SUCCESS;
    case cudaErrorInvalidValue:
      return TB_ERROR_INVALID_VALUE;
    case cudaErrorInvalidDevice:
      return TB_ERROR_INVALID_DEVICE;
    case cudaErrorMemoryAllocation:
      return TB_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidHostPointer:
      return TB_ERROR_INVALID_POINTER;
    case cudaErrorNotReady:
      return TB_ERROR_NOT_READY;
    case cudaErrorInvalidResourceHandle:
      return TB_ERROR_INVALID_HANDLE;
    default:
      // Everything else (no driver, launch failures, ECC errors, illegal addresses, ...) means
      // the device or its driver cannot go on; the CUDA text in the message says which.
      return TB_ERROR_DEVICE_FAILURE;
  }
}

tb_status report_cuda_error(const char* call, cudaError_t error) {
  return report_cuda_error(call, error, map_cuda_error(error), std::string());
}

tb_status report_cuda_error(const char* call, cudaError_t error, tb_status status,
                            const std::string& detail) {
  // The CUDA runtime also remembers the error per thread, and cudaGetLastError/
  // cudaPeekAtLastError would hand it to whoever asks next (PyTorch checks it after every
  // kernel launch). A failure already reported here must not resurface there as someone else's.
  // Sticky errors (a corrupted context) are not cleared by this and keep failing later calls.
  (void)cudaGetLastError();
  std::string message = describe(call, error);
  if (!detail.empty()) message += ": " + detail;
  return report_error(status, std::move(message));
}

tb_status report_error(tb_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

tb_status report_null_argument(const char* entry, const char* argument) {
  return report_error(TB_ERROR_INVALID_VALUE, std::string(entry) + ": " + argument + " is NULL");
}

const char* status_string(void* /*context*/, tb_status status) {
  switch (status) {
    case TB_SUCCESS:
      return "success";
    case TB_ERROR_INVALID_VALUE:
      return "invalid value";
    case TB_ERROR_INVALID_DEVICE:
      return "invalid device";
    case TB_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case TB_ERROR_INVALID_POINTER:
      return "invalid pointer";
    case TB_ERROR_NOT_READY:
      return "not ready";
    case TB_ERROR_INVALID_HANDLE:
      return "invalid handle";
    case TB_ERROR_NOT_SUPPORTED:
      return "not supported";
    case TB_ERROR_DEVICE_FAILURE:
      return "device failure";
    case TB_ERROR_UNKNOWN:
      return "unknown error";
  }
  // A value outside the enum (a newer SDK, or garbage): the entry must still never return NULL.
  return "unrecognized tb_status";
}

const char* last_error_message(void* /*context*/) {
  // Valid until this thread's next failure replaces it.
  return last_error.c_str();
}

}  // namespace torchbridge::cuda_device

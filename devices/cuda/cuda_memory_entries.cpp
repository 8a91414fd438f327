// Memory entries: device and pinned host allocations, synchronous and stream-ordered copies.
#include <cuda_runtime_api.h>

#include <string>

#include "cuda_context.h"
#include "cuda_entries.h"
#include "cuda_handles.h"
#include "cuda_status.h"
#include "device_scope.h"

namespace torchbridge::cuda_device {
namespace {

bool to_cuda_kind(tb_memcpy_kind kind, cudaMemcpyKind* out) {
  switch (kind) {
    case TB_MEMCPY_HOST_TO_DEVICE:
      *out = cudaMemcpyHostToDevice;
      return true;
    case TB_MEMCPY_DEVICE_TO_HOST:
      *out = cudaMemcpyDeviceToHost;
      return true;
    case TB_MEMCPY_DEVICE_TO_DEVICE:
      *out = cudaMemcpyDeviceToDevice;
      return true;
  }
  return false;
}

tb_status unknown_kind(const char* entry, tb_memcpy_kind kind) {
  return report_error(TB_ERROR_INVALID_VALUE, std::string(entry) + ": unknown copy kind " +
                                                  std::to_string(static_cast<int>(kind)));
}

// The arguments every copy checks the same way. bytes == 0 is valid and copies nothing.
tb_status check_copy(const char* entry, void* dst, const void* src, size_t bytes,
                     tb_memcpy_kind kind, cudaMemcpyKind* cuda_kind) {
  if (!to_cuda_kind(kind, cuda_kind)) return unknown_kind(entry, kind);
  if (bytes != 0 && dst == nullptr) return report_null_argument(entry, "dst");
  if (bytes != 0 && src == nullptr) return report_null_argument(entry, "src");
  return TB_SUCCESS;
}

// cudaFree/cudaFreeHost say cudaErrorInvalidValue for a pointer they do not know (never
// allocated, or already freed); the SDK has a dedicated status for exactly that.
tb_status report_free_error(const char* call, cudaError_t error) {
  if (error == cudaErrorInvalidValue || error == cudaErrorInvalidDevicePointer ||
      error == cudaErrorInvalidHostPointer) {
    return report_cuda_error(call, error, TB_ERROR_INVALID_POINTER,
                             "the pointer is not a live allocation of this runtime");
  }
  return report_cuda_error(call, error);
}

}  // namespace

tb_status device_malloc(void* context, int32_t device, size_t bytes, void** pointer) {
  if (pointer == nullptr) return report_null_argument("device_malloc", "pointer");
  if (tb_status status = check_device_index(context_of(context), "device_malloc", device);
      status != TB_SUCCESS) {
    return status;
  }
  *pointer = nullptr;
  // An empty allocation needs no memory; NULL is what cudaMalloc would give too.
  if (bytes == 0) return TB_SUCCESS;

  // cudaMalloc allocates on the current device.
  DeviceScope scope;
  if (tb_status status = scope.enter(device); status != TB_SUCCESS) return status;
  void* allocated = nullptr;
  cudaError_t error = cudaMalloc(&allocated, bytes);
  if (error == cudaErrorMemoryAllocation) {
    // Say how far off the request was: the number a user needs to resize a batch or a model.
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    const bool known = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
    std::string detail = "requested " + std::to_string(bytes) + " bytes on device " +
                         std::to_string(device) + ", " +
                         (known ? std::to_string(free_bytes) + " bytes free of " +
                                      std::to_string(total_bytes)
                                : std::string("free bytes unknown"));
    return report_cuda_error("cudaMalloc", error, TB_ERROR_OUT_OF_MEMORY, detail);
  }
  if (tb_status status = check_cuda("cudaMalloc", error); status != TB_SUCCESS) return status;
  *pointer = allocated;
  return TB_SUCCESS;
}

tb_status device_free(void* context, int32_t device, void* pointer) {
  if (tb_status status = check_device_index(context_of(context), "device_free", device);
      status != TB_SUCCESS) {
    return status;
  }
  if (pointer == nullptr) return TB_SUCCESS;  // like free(NULL); device_malloc(0) returns NULL
  DeviceScope scope;
  if (tb_status status = scope.enter(device); status != TB_SUCCESS) return status;
  cudaError_t error = cudaFree(pointer);
  return error == cudaSuccess ? TB_SUCCESS : report_free_error("cudaFree", error);
}

tb_status host_malloc(void* /*context*/, size_t bytes, void** pointer) {
  if (pointer == nullptr) return report_null_argument("host_malloc", "pointer");
  *pointer = nullptr;
  if (bytes == 0) return TB_SUCCESS;
  void* allocated = nullptr;
  // Portable: the SDK's pinned memory belongs to no device, so every device's context must treat
  // it as page-locked (fast, truly asynchronous copies), not only the one current right now.
  cudaError_t error = cudaHostAlloc(&allocated, bytes, cudaHostAllocPortable);
  if (error == cudaErrorMemoryAllocation) {
    return report_cuda_error("cudaHostAlloc", error, TB_ERROR_OUT_OF_MEMORY,
                             "requested " + std::to_string(bytes) + " bytes of pinned host memory");
  }
  if (tb_status status = check_cuda("cudaHostAlloc", error); status != TB_SUCCESS) return status;
  *pointer = allocated;
  return TB_SUCCESS;
}

tb_status host_free(void* /*context*/, void* pointer) {
  if (pointer == nullptr) return TB_SUCCESS;
  cudaError_t error = cudaFreeHost(pointer);
  return error == cudaSuccess ? TB_SUCCESS : report_free_error("cudaFreeHost", error);
}

tb_status memcpy_sync(void* /*context*/, void* dst, const void* src, size_t bytes,
                      tb_memcpy_kind kind) {
  cudaMemcpyKind cuda_kind{};
  if (tb_status status = check_copy("memcpy_sync", dst, src, bytes, kind, &cuda_kind);
      status != TB_SUCCESS) {
    return status;
  }
  if (bytes == 0) return TB_SUCCESS;
  if (tb_status status = check_cuda("cudaMemcpy", cudaMemcpy(dst, src, bytes, cuda_kind));
      status != TB_SUCCESS) {
    return status;
  }
  // The SDK promises the bytes have arrived when this returns, but cudaMemcpy may return earlier:
  // device-to-device copies are asynchronous to the host, and host-to-device copies from pageable
  // memory return once the data is staged, before the DMA lands. Both were queued on the current
  // device's legacy default stream, so waiting for that stream closes the gap. Our own streams are
  // non-blocking, so this waits for nothing the caller queued on them.
  if (cuda_kind != cudaMemcpyDeviceToHost) {
    return check_cuda("cudaStreamSynchronize(cudaStreamLegacy)",
                      cudaStreamSynchronize(cudaStreamLegacy));
  }
  return TB_SUCCESS;
}

tb_status memcpy_async(void* /*context*/, void* dst, const void* src, size_t bytes,
                       tb_memcpy_kind kind, tb_stream stream) {
  if (tb_status status = check_stream("memcpy_async", stream); status != TB_SUCCESS) return status;
  cudaMemcpyKind cuda_kind{};
  if (tb_status status = check_copy("memcpy_async", dst, src, bytes, kind, &cuda_kind);
      status != TB_SUCCESS) {
    return status;
  }
  if (bytes == 0) return TB_SUCCESS;
  // Work is queued with the stream's own device current, as a kernel launch would require.
  DeviceScope scope;
  if (tb_status status = scope.enter(stream->device); status != TB_SUCCESS) return status;
  return check_cuda("cudaMemcpyAsync",
                    cudaMemcpyAsync(dst, src, bytes, cuda_kind, stream->stream));
}

tb_status memset_async(void* /*context*/, void* dst, int32_t value, size_t bytes,
                       tb_stream stream) {
  if (tb_status status = check_stream("memset_async", stream); status != TB_SUCCESS) return status;
  if (bytes == 0) return TB_SUCCESS;
  if (dst == nullptr) return report_null_argument("memset_async", "dst");
  DeviceScope scope;
  if (tb_status status = scope.enter(stream->device); status != TB_SUCCESS) return status;
  // Like memset, only the low byte of `value` is used.
  return check_cuda("cudaMemsetAsync", cudaMemsetAsync(dst, value, bytes, stream->stream));
}

}  // namespace torchbridge::cuda_device

// Stream entries: each tb_stream owns one non-blocking cudaStream_t of one device.
#include <cuda_runtime_api.h>

#include <memory>
#include <new>

#include "cuda_context.h"
#include "cuda_entries.h"
#include "cuda_handles.h"
#include "cuda_status.h"
#include "device_scope.h"

namespace torchbridge::cuda_device {

tb_status stream_create(void* context, int32_t device, int32_t priority, tb_stream* stream) {
  if (stream == nullptr) return report_null_argument("stream_create", "stream");
  if (tb_status status = check_device_index(context_of(context), "stream_create", device);
      status != TB_SUCCESS) {
    return status;
  }
  // A stream belongs to the device current at creation.
  DeviceScope scope;
  if (tb_status status = scope.enter(device); status != TB_SUCCESS) return status;

  // Non-blocking: the SDK says streams are unordered unless joined with events, while a CUDA
  // "blocking" stream would also wait for (and hold up) the legacy default stream that other code
  // in the process, cudaMemcpy included, uses. Priorities follow CUDA (and PyTorch): lower numbers
  // run first, and CUDA clamps values outside cudaDeviceGetStreamPriorityRange.
  cudaStream_t cuda_stream = nullptr;
  if (tb_status status =
          check_cuda("cudaStreamCreateWithPriority",
                     cudaStreamCreateWithPriority(&cuda_stream, cudaStreamNonBlocking, priority));
      status != TB_SUCCESS) {
    return status;
  }
  auto* handle = new (std::nothrow) tb_stream_s{cuda_stream, device};
  if (handle == nullptr) {
    (void)cudaStreamDestroy(cuda_stream);
    return report_error(TB_ERROR_OUT_OF_MEMORY, "stream_create: out of host memory for the handle");
  }
  live_streams().add(handle);
  *stream = handle;
  return TB_SUCCESS;
}

tb_status stream_destroy(void* /*context*/, tb_stream stream) {
  // Removing first makes a concurrent or repeated destroy of the same handle fail cleanly.
  if (stream == nullptr || !live_streams().remove(stream)) {
    return check_stream("stream_destroy", stream);
  }
  // Returns at once; CUDA releases the stream after its queued work completes.
  cudaError_t error = cudaStreamDestroy(stream->stream);
  delete stream;
  return check_cuda("cudaStreamDestroy", error);
}

tb_status stream_query(void* /*context*/, tb_stream stream) {
  if (tb_status status = check_stream("stream_query", stream); status != TB_SUCCESS) return status;
  cudaError_t error = cudaStreamQuery(stream->stream);
  if (error == cudaErrorNotReady) {
    // "Still busy" is an answer, not a failure: leave the last error message alone, but clear
    // CUDA's per-thread error so it is not mistaken for a failure later.
    (void)cudaGetLastError();
    return TB_ERROR_NOT_READY;
  }
  return check_cuda("cudaStreamQuery", error);
}

tb_status stream_synchronize(void* /*context*/, tb_stream stream) {
  if (tb_status status = check_stream("stream_synchronize", stream); status != TB_SUCCESS) {
    return status;
  }
  return check_cuda("cudaStreamSynchronize", cudaStreamSynchronize(stream->stream));
}

tb_status stream_wait_event(void* /*context*/, tb_stream stream, tb_event event) {
  if (tb_status status = check_stream("stream_wait_event", stream); status != TB_SUCCESS) {
    return status;
  }
  if (tb_status status = check_event("stream_wait_event", event); status != TB_SUCCESS) {
    return status;
  }
  // The device waits, not the host; the stream and the event may belong to different devices.
  return check_cuda("cudaStreamWaitEvent", cudaStreamWaitEvent(stream->stream, event->event, 0));
}

}  // namespace torchbridge::cuda_device

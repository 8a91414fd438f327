// Event entries: each tb_event owns one cudaEvent_t of one device.
#include <cuda_runtime_api.h>

#include <new>
#include <string>

#include "cuda_context.h"
#include "cuda_entries.h"
#include "cuda_handles.h"
#include "cuda_status.h"
#include "device_scope.h"

namespace torchbridge::cuda_device {

tb_status event_create(void* context, int32_t device, int32_t enable_timing, tb_event* event) {
  if (event == nullptr) return report_null_argument("event_create", "event");
  if (tb_status status = check_device_index(context_of(context), "event_create", device);
      status != TB_SUCCESS) {
    return status;
  }
  // An event belongs to the device current at creation.
  DeviceScope scope;
  if (tb_status status = scope.enter(device); status != TB_SUCCESS) return status;

  // Timing costs a timestamp write on every record, so events only time when asked to.
  const unsigned int flags = enable_timing != 0 ? cudaEventDefault : cudaEventDisableTiming;
  cudaEvent_t cuda_event = nullptr;
  if (tb_status status =
          check_cuda("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&cuda_event, flags));
      status != TB_SUCCESS) {
    return status;
  }
  auto* handle = new (std::nothrow) tb_event_s{cuda_event, device};
  if (handle == nullptr) {
    (void)cudaEventDestroy(cuda_event);
    return report_error(TB_ERROR_OUT_OF_MEMORY, "event_create: out of host memory for the handle");
  }
  live_events().add(handle);
  *event = handle;
  return TB_SUCCESS;
}

tb_status event_destroy(void* /*context*/, tb_event event) {
  // Removing first makes a concurrent or repeated destroy of the same handle fail cleanly.
  if (event == nullptr || !live_events().remove(event)) return check_event("event_destroy", event);
  cudaError_t error = cudaEventDestroy(event->event);
  delete event;
  return check_cuda("cudaEventDestroy", error);
}

tb_status event_record(void* /*context*/, tb_event event, tb_stream stream) {
  if (tb_status status = check_event("event_record", event); status != TB_SUCCESS) return status;
  if (tb_status status = check_stream("event_record", stream); status != TB_SUCCESS) return status;
  // CUDA refuses this with a bare "invalid resource handle"; say what is actually wrong.
  if (event->device != stream->device) {
    return report_error(TB_ERROR_INVALID_VALUE,
                        "event_record: the event belongs to device " +
                            std::to_string(event->device) + " but the stream to device " +
                            std::to_string(stream->device));
  }
  return check_cuda("cudaEventRecord", cudaEventRecord(event->event, stream->stream));
}

tb_status event_query(void* /*context*/, tb_event event) {
  if (tb_status status = check_event("event_query", event); status != TB_SUCCESS) return status;
  cudaError_t error = cudaEventQuery(event->event);
  if (error == cudaErrorNotReady) {
    // Pending is an answer, not a failure (see stream_query).
    (void)cudaGetLastError();
    return TB_ERROR_NOT_READY;
  }
  return check_cuda("cudaEventQuery", error);
}

tb_status event_synchronize(void* /*context*/, tb_event event) {
  if (tb_status status = check_event("event_synchronize", event); status != TB_SUCCESS) {
    return status;
  }
  return check_cuda("cudaEventSynchronize", cudaEventSynchronize(event->event));
}

tb_status event_elapsed_time(void* /*context*/, tb_event start, tb_event end,
                             float* milliseconds) {
  if (milliseconds == nullptr) return report_null_argument("event_elapsed_time", "milliseconds");
  if (tb_status status = check_event("event_elapsed_time", start); status != TB_SUCCESS) {
    return status;
  }
  if (tb_status status = check_event("event_elapsed_time", end); status != TB_SUCCESS) {
    return status;
  }
  // CUDA reports cudaErrorNotReady (-> TB_ERROR_NOT_READY) while either event is pending, and
  // an invalid resource handle for events created without timing or never recorded.
  float elapsed = 0.0f;
  if (tb_status status = check_cuda("cudaEventElapsedTime",
                                    cudaEventElapsedTime(&elapsed, start->event, end->event));
      status != TB_SUCCESS) {
    return status;
  }
  *milliseconds = elapsed;
  return TB_SUCCESS;
}

}  // namespace torchbridge::cuda_device

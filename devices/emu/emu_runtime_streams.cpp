// EmuRuntime: stream and event entries. Handles are registry keys (see handle_registry.h), so
// unknown or destroyed handles are reported, never dereferenced.
#include "emu_runtime.h"

#include "last_error.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace torchbridge::emu {
namespace {

std::uintptr_t key(const void* handle) { return reinterpret_cast<std::uintptr_t>(handle); }

}  // namespace

tb_status EmuRuntime::find_stream(const char* operation, tb_stream handle, std::shared_ptr<Stream>& stream) const {
  if (handle == nullptr) {
    return fail(TB_ERROR_INVALID_HANDLE, std::string(operation) +
                                             ": stream is NULL; the emu runtime has no default stream, "
                                             "use one from stream_create");
  }
  stream = streams_.find(key(handle));
  if (stream) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_HANDLE, std::string(operation) + ": stream " + pointer_text(handle) +
                                           " is not a live stream of this runtime (never created, or destroyed)");
}

tb_status EmuRuntime::find_event(const char* operation, tb_event handle, std::shared_ptr<Event>& event) const {
  if (handle == nullptr) return fail(TB_ERROR_INVALID_HANDLE, std::string(operation) + ": event is NULL");
  event = events_.find(key(handle));
  if (event) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_HANDLE, std::string(operation) + ": event " + pointer_text(handle) +
                                           " is not a live event of this runtime (never created, or destroyed)");
}

// ---- Streams ------------------------------------------------------------------------------------

tb_status EmuRuntime::stream_create(int32_t device, int32_t priority, tb_stream* handle) {
  if (const tb_status status = check_device("stream_create", device); status != TB_SUCCESS) return status;
  if (handle == nullptr) return fail(TB_ERROR_INVALID_VALUE, "stream_create: stream is NULL");
  std::shared_ptr<Stream> stream;
  try {
    stream = std::make_shared<Stream>(device, priority, options_.latency);
  } catch (const std::system_error& error) {
    return fail(TB_ERROR_DEVICE_FAILURE,
                std::string("stream_create: could not start the stream's worker thread: ") + error.what());
  }
  *handle = reinterpret_cast<tb_stream>(streams_.add(std::move(stream)));
  return TB_SUCCESS;
}

tb_status EmuRuntime::stream_destroy(tb_stream handle) {
  if (handle == nullptr) return fail(TB_ERROR_INVALID_HANDLE, "stream_destroy: stream is NULL");
  // Unregistered first, so no new caller can find it; calls already holding it finish normally.
  const std::shared_ptr<Stream> stream = streams_.remove(key(handle));
  if (!stream) {
    return fail(TB_ERROR_INVALID_HANDLE, "stream_destroy: stream " + pointer_text(handle) +
                                             " is not a live stream of this runtime (never created, or destroyed)");
  }
  stream->shut_down();  // queued work still runs, as on real devices
  return TB_SUCCESS;
}

tb_status EmuRuntime::stream_query(tb_stream handle) {
  std::shared_ptr<Stream> stream;
  if (const tb_status status = find_stream("stream_query", handle, stream); status != TB_SUCCESS) return status;
  // NOT_READY is an answer, not a failure: the thread's last error sentence is left alone.
  return stream->idle() ? TB_SUCCESS : TB_ERROR_NOT_READY;
}

tb_status EmuRuntime::stream_synchronize(tb_stream handle) {
  std::shared_ptr<Stream> stream;
  if (const tb_status status = find_stream("stream_synchronize", handle, stream); status != TB_SUCCESS) {
    return status;
  }
  stream->synchronize();
  return TB_SUCCESS;
}

tb_status EmuRuntime::stream_wait_event(tb_stream stream_handle, tb_event event_handle) {
  std::shared_ptr<Stream> stream;
  std::shared_ptr<Event> event;
  if (const tb_status status = find_stream("stream_wait_event", stream_handle, stream); status != TB_SUCCESS) {
    return status;
  }
  if (const tb_status status = find_event("stream_wait_event", event_handle, event); status != TB_SUCCESS) {
    return status;
  }
  // The record as of now: a later re-record must not move what this wait is waiting for.
  const std::uint64_t generation = event->latest_generation();
  if (generation == 0) return TB_SUCCESS;  // never recorded: nothing to wait for (as in CUDA)
  if (stream->enqueue([event, generation] { event->wait_for(generation); })) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_HANDLE, "stream_wait_event: stream " + pointer_text(stream_handle) +
                                           " is being destroyed");
}

// ---- Events -------------------------------------------------------------------------------------

tb_status EmuRuntime::event_create(int32_t device, int32_t enable_timing, tb_event* handle) {
  if (const tb_status status = check_device("event_create", device); status != TB_SUCCESS) return status;
  if (handle == nullptr) return fail(TB_ERROR_INVALID_VALUE, "event_create: event is NULL");
  *handle = reinterpret_cast<tb_event>(events_.add(std::make_shared<Event>(device, enable_timing != 0)));
  return TB_SUCCESS;
}

tb_status EmuRuntime::event_destroy(tb_event handle) {
  if (handle == nullptr) return fail(TB_ERROR_INVALID_HANDLE, "event_destroy: event is NULL");
  // A marker or wait still queued keeps its own reference, so destroying early is safe.
  if (events_.remove(key(handle))) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_HANDLE, "event_destroy: event " + pointer_text(handle) +
                                           " is not a live event of this runtime (never created, or destroyed)");
}

tb_status EmuRuntime::event_record(tb_event event_handle, tb_stream stream_handle) {
  std::shared_ptr<Event> event;
  std::shared_ptr<Stream> stream;
  if (const tb_status status = find_event("event_record", event_handle, event); status != TB_SUCCESS) return status;
  if (const tb_status status = find_stream("event_record", stream_handle, stream); status != TB_SUCCESS) {
    return status;
  }
  if (event->device() != stream->device()) {
    return fail(TB_ERROR_INVALID_VALUE, "event_record: event " + pointer_text(event_handle) + " belongs to device " +
                                            std::to_string(event->device()) + " but stream " +
                                            pointer_text(stream_handle) + " to device " +
                                            std::to_string(stream->device()));
  }
  if (event->record_on(*stream)) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_HANDLE, "event_record: stream " + pointer_text(stream_handle) + " is being destroyed");
}

tb_status EmuRuntime::event_query(tb_event handle) {
  std::shared_ptr<Event> event;
  if (const tb_status status = find_event("event_query", handle, event); status != TB_SUCCESS) return status;
  return event->state() == Event::State::pending ? TB_ERROR_NOT_READY : TB_SUCCESS;
}

tb_status EmuRuntime::event_synchronize(tb_event handle) {
  std::shared_ptr<Event> event;
  if (const tb_status status = find_event("event_synchronize", handle, event); status != TB_SUCCESS) return status;
  event->wait_for(event->latest_generation());
  return TB_SUCCESS;
}

tb_status EmuRuntime::event_elapsed_time(tb_event start_handle, tb_event end_handle, float* milliseconds) {
  if (milliseconds == nullptr) return fail(TB_ERROR_INVALID_VALUE, "event_elapsed_time: milliseconds is NULL");
  std::shared_ptr<Event> events[2];
  const tb_event handles[2] = {start_handle, end_handle};
  const char* roles[2] = {"start", "end"};
  std::chrono::steady_clock::time_point times[2];
  for (int i = 0; i < 2; ++i) {
    if (const tb_status status = find_event("event_elapsed_time", handles[i], events[i]); status != TB_SUCCESS) {
      return status;
    }
  }
  for (int i = 0; i < 2; ++i) {
    const std::string which = std::string("event_elapsed_time: ") + roles[i] + " event " + pointer_text(handles[i]);
    if (!events[i]->timing_enabled()) {
      return fail(TB_ERROR_INVALID_VALUE, which + " was created with enable_timing = 0");
    }
    const Event::State state = events[i]->state();
    if (state == Event::State::never_recorded) return fail(TB_ERROR_INVALID_VALUE, which + " has never been recorded");
    const auto time = events[i]->completion_time();
    if (state == Event::State::pending || !time) {
      return fail(TB_ERROR_NOT_READY, which + " has not completed yet; synchronize it first");
    }
    times[i] = *time;
  }
  *milliseconds = std::chrono::duration<float, std::milli>(times[1] - times[0]).count();
  return TB_SUCCESS;
}

}  // namespace torchbridge::emu

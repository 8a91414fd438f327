/*
 * minimal: the smallest complete TorchBridge device, in plain C11 with POSIX threads.
 *
 * A starting point for a hardware vendor: copy this file, rename the device, and replace each
 * entry's body with calls into your driver. Everything PyTorch needs (guard, caching allocator,
 * streams, events, generators, operators through the CPU fallback, autocast, serialization,
 * profiler) is built by TorchBridge on top of the table filled in at the bottom; this file includes
 * nothing but <torchbridge/sdk/runtime.h> and the C library.
 *
 * The "device" here is host memory with a fixed capacity, and its streams run each operation at
 * the moment it is queued, which the interface allows: work on one stream is then trivially in
 * order, every stream and event is always complete, and an event's time is the host clock at the
 * moment it was recorded. A real device queues work and reports completion; see devices/emu for
 * an emulated one that does (worker threads, latency, guarded memory).
 */
#define _POSIX_C_SOURCE 200809L

#include <torchbridge/sdk/runtime.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEVICE_COUNT 2
#define DEVICE_CAPACITY_BYTES ((uint64_t)1 << 30) /* 1 GiB per device */
#define ALIGNMENT 256                              /* what CUDA guarantees; torch expects >= 64 */

/* ---- errors: one sentence per thread about its last failure ----------------------------------- */

static _Thread_local char last_error[512];

static tb_status fail(tb_status status, const char* format, ...) {
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(last_error, sizeof last_error, format, arguments);
  va_end(arguments);
  return status;
}

static const char* status_string(void* context, tb_status status) {
  (void)context;
  switch (status) {
    case TB_SUCCESS: return "success";
    case TB_ERROR_INVALID_VALUE: return "invalid value";
    case TB_ERROR_INVALID_DEVICE: return "invalid device";
    case TB_ERROR_OUT_OF_MEMORY: return "out of memory";
    case TB_ERROR_INVALID_POINTER: return "invalid pointer";
    case TB_ERROR_NOT_READY: return "not ready";
    case TB_ERROR_INVALID_HANDLE: return "invalid handle";
    case TB_ERROR_NOT_SUPPORTED: return "not supported";
    case TB_ERROR_DEVICE_FAILURE: return "device failure";
    default: return "unknown error";
  }
}

static const char* last_error_message(void* context) {
  (void)context;
  return last_error;
}

/* ---- devices ---------------------------------------------------------------------------------- */

/* A live allocation: kept in its device's list so that a pointer this runtime never handed out,
 * or handed out by the other device, is refused instead of corrupting the books. */
typedef struct block {
  void* pointer;
  size_t bytes;
  struct block* next;
} block;

typedef struct device_state {
  pthread_mutex_t mutex;
  uint64_t used_bytes;
  block* live;
} device_state;

static device_state devices[DEVICE_COUNT] = {
    {PTHREAD_MUTEX_INITIALIZER, 0, NULL},
    {PTHREAD_MUTEX_INITIALIZER, 0, NULL},
};

static _Thread_local int32_t current_device = 0; /* "current device" is per host thread */

static tb_status check_device(const char* entry, int32_t device) {
  if (device < 0 || device >= DEVICE_COUNT) {
    return fail(TB_ERROR_INVALID_DEVICE, "%s: device %d does not exist; minimal has devices 0..%d", entry,
                (int)device, DEVICE_COUNT - 1);
  }
  return TB_SUCCESS;
}

static tb_status device_count(void* context, int32_t* count) {
  (void)context;
  if (count == NULL) return fail(TB_ERROR_INVALID_VALUE, "device_count: count is NULL");
  *count = DEVICE_COUNT;
  return TB_SUCCESS;
}

static tb_status set_device(void* context, int32_t device) {
  (void)context;
  tb_status status = check_device("set_device", device);
  if (status == TB_SUCCESS) current_device = device;
  return status;
}

static tb_status get_device(void* context, int32_t* device) {
  (void)context;
  if (device == NULL) return fail(TB_ERROR_INVALID_VALUE, "get_device: device is NULL");
  *device = current_device;
  return TB_SUCCESS;
}

static tb_status device_properties(void* context, int32_t device, tb_device_properties* properties) {
  (void)context;
  tb_status status = check_device("device_properties", device);
  if (status != TB_SUCCESS) return status;
  if (properties == NULL) return fail(TB_ERROR_INVALID_VALUE, "device_properties: properties is NULL");
  memset(properties, 0, sizeof *properties);
  snprintf(properties->name, sizeof properties->name, "TorchBridge minimal C device");
  snprintf(properties->vendor, sizeof properties->vendor, "TorchBridge example");
  properties->total_memory_bytes = DEVICE_CAPACITY_BYTES;
  pthread_mutex_lock(&devices[device].mutex);
  properties->free_memory_bytes = DEVICE_CAPACITY_BYTES - devices[device].used_bytes;
  pthread_mutex_unlock(&devices[device].mutex);
  properties->host_addressable = 1; /* its memory is host memory: the CPU fallback works in place */
  properties->is_real_hardware = 0; /* an example: never preferred over the CPU */
  return TB_SUCCESS;
}

static tb_status device_synchronize(void* context, int32_t device) {
  (void)context;
  return check_device("device_synchronize", device); /* all work is done when it is queued */
}

/* ---- memory ----------------------------------------------------------------------------------- */

static tb_status device_malloc(void* context, int32_t device, size_t bytes, void** pointer) {
  (void)context;
  tb_status status = check_device("device_malloc", device);
  if (status != TB_SUCCESS) return status;
  if (pointer == NULL) return fail(TB_ERROR_INVALID_VALUE, "device_malloc: pointer is NULL");
  *pointer = NULL;
  if (bytes == 0) return TB_SUCCESS; /* like cudaMalloc(0): nothing to hand out, not an error */
  device_state* state = &devices[device];
  pthread_mutex_lock(&state->mutex);
  const uint64_t free_bytes = DEVICE_CAPACITY_BYTES - state->used_bytes;
  if (bytes > free_bytes) {
    pthread_mutex_unlock(&state->mutex);
    return fail(TB_ERROR_OUT_OF_MEMORY, "out of memory on minimal device %d: requested %zu bytes, %llu bytes free of %llu",
                (int)device, bytes, (unsigned long long)free_bytes, (unsigned long long)DEVICE_CAPACITY_BYTES);
  }
  block* entry = malloc(sizeof *entry);
  const size_t rounded = (bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT; /* aligned_alloc needs a multiple */
  void* memory = entry != NULL && rounded >= bytes ? aligned_alloc(ALIGNMENT, rounded) : NULL;
  if (memory == NULL) {
    pthread_mutex_unlock(&state->mutex);
    free(entry);
    return fail(TB_ERROR_OUT_OF_MEMORY, "minimal device %d: the host could not provide %zu bytes", (int)device, bytes);
  }
  entry->pointer = memory;
  entry->bytes = bytes;
  entry->next = state->live;
  state->live = entry;
  state->used_bytes += bytes;
  pthread_mutex_unlock(&state->mutex);
  *pointer = memory;
  return TB_SUCCESS;
}

static tb_status device_free(void* context, int32_t device, void* pointer) {
  (void)context;
  tb_status status = check_device("device_free", device);
  if (status != TB_SUCCESS || pointer == NULL) return status; /* like free(NULL) */
  device_state* state = &devices[device];
  pthread_mutex_lock(&state->mutex);
  for (block** link = &state->live; *link != NULL; link = &(*link)->next) {
    block* entry = *link;
    if (entry->pointer == pointer) {
      *link = entry->next;
      state->used_bytes -= entry->bytes;
      pthread_mutex_unlock(&state->mutex);
      free(entry->pointer);
      free(entry);
      return TB_SUCCESS;
    }
  }
  pthread_mutex_unlock(&state->mutex);
  return fail(TB_ERROR_INVALID_POINTER, "device_free: %p is not a live allocation of minimal device %d", pointer,
              (int)device);
}

static tb_status host_malloc(void* context, size_t bytes, void** pointer) {
  (void)context;
  if (pointer == NULL) return fail(TB_ERROR_INVALID_VALUE, "host_malloc: pointer is NULL");
  *pointer = NULL;
  if (bytes == 0) return TB_SUCCESS;
  /* "Pinned" memory matters only to a DMA engine; this device has none, so plain memory will do. */
  *pointer = malloc(bytes);
  return *pointer != NULL ? TB_SUCCESS
                          : fail(TB_ERROR_OUT_OF_MEMORY, "host_malloc: the host could not provide %zu bytes", bytes);
}

static tb_status host_free(void* context, void* pointer) {
  (void)context;
  free(pointer);
  return TB_SUCCESS;
}

static tb_status check_copy(const char* entry, const void* dst, const void* src, size_t bytes, tb_memcpy_kind kind) {
  if (kind != TB_MEMCPY_HOST_TO_DEVICE && kind != TB_MEMCPY_DEVICE_TO_HOST && kind != TB_MEMCPY_DEVICE_TO_DEVICE) {
    return fail(TB_ERROR_INVALID_VALUE, "%s: unknown copy kind %d", entry, (int)kind);
  }
  if (bytes > 0 && (dst == NULL || src == NULL)) {
    return fail(TB_ERROR_INVALID_VALUE, "%s: %zu bytes from %p to %p", entry, bytes, src, dst);
  }
  return TB_SUCCESS;
}

static tb_status memcpy_sync(void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind) {
  (void)context;
  tb_status status = check_copy("memcpy_sync", dst, src, bytes, kind);
  if (status == TB_SUCCESS && bytes > 0) memmove(dst, src, bytes);
  return status;
}

static tb_status memcpy_async(void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind,
                              tb_stream stream) {
  if (stream == NULL) return fail(TB_ERROR_INVALID_HANDLE, "memcpy_async: stream is NULL");
  return memcpy_sync(context, dst, src, bytes, kind); /* streams run work as it is queued */
}

static tb_status memset_async(void* context, void* dst, int32_t value, size_t bytes, tb_stream stream) {
  (void)context;
  if (stream == NULL) return fail(TB_ERROR_INVALID_HANDLE, "memset_async: stream is NULL");
  if (bytes > 0 && dst == NULL) return fail(TB_ERROR_INVALID_VALUE, "memset_async: %zu bytes at NULL", bytes);
  if (bytes > 0) memset(dst, value, bytes);
  return TB_SUCCESS;
}

/* ---- streams and events ----------------------------------------------------------------------- */

struct tb_stream_s {
  int32_t device;
};

struct tb_event_s {
  int32_t device;
  int32_t enable_timing;
  int32_t recorded;
  double recorded_at_ms; /* host clock when recorded: the work before it was already done */
};

static double now_ms(void) {
  struct timespec time;
  clock_gettime(CLOCK_MONOTONIC, &time);
  return (double)time.tv_sec * 1e3 + (double)time.tv_nsec / 1e6;
}

static tb_status stream_create(void* context, int32_t device, int32_t priority, tb_stream* stream) {
  (void)context;
  (void)priority; /* one kind of stream: every priority is the same */
  tb_status status = check_device("stream_create", device);
  if (status != TB_SUCCESS) return status;
  if (stream == NULL) return fail(TB_ERROR_INVALID_VALUE, "stream_create: stream is NULL");
  *stream = malloc(sizeof **stream);
  if (*stream == NULL) return fail(TB_ERROR_OUT_OF_MEMORY, "stream_create: out of host memory");
  (*stream)->device = device;
  return TB_SUCCESS;
}

static tb_status stream_destroy(void* context, tb_stream stream) {
  (void)context;
  free(stream);
  return TB_SUCCESS;
}

static tb_status stream_query(void* context, tb_stream stream) {
  (void)context;
  return stream != NULL ? TB_SUCCESS : fail(TB_ERROR_INVALID_HANDLE, "stream_query: stream is NULL");
}

static tb_status stream_synchronize(void* context, tb_stream stream) {
  return stream_query(context, stream);
}

static tb_status stream_wait_event(void* context, tb_stream stream, tb_event event) {
  (void)context;
  if (stream == NULL || event == NULL) return fail(TB_ERROR_INVALID_HANDLE, "stream_wait_event: a handle is NULL");
  return TB_SUCCESS; /* the event's work is done already */
}

static tb_status event_create(void* context, int32_t device, int32_t enable_timing, tb_event* event) {
  (void)context;
  tb_status status = check_device("event_create", device);
  if (status != TB_SUCCESS) return status;
  if (event == NULL) return fail(TB_ERROR_INVALID_VALUE, "event_create: event is NULL");
  *event = calloc(1, sizeof **event);
  if (*event == NULL) return fail(TB_ERROR_OUT_OF_MEMORY, "event_create: out of host memory");
  (*event)->device = device;
  (*event)->enable_timing = enable_timing;
  return TB_SUCCESS;
}

static tb_status event_destroy(void* context, tb_event event) {
  (void)context;
  free(event);
  return TB_SUCCESS;
}

static tb_status event_record(void* context, tb_event event, tb_stream stream) {
  (void)context;
  if (event == NULL || stream == NULL) return fail(TB_ERROR_INVALID_HANDLE, "event_record: a handle is NULL");
  if (event->device != stream->device) {
    return fail(TB_ERROR_INVALID_VALUE, "event_record: an event of device %d cannot be recorded on a stream of device %d",
                (int)event->device, (int)stream->device);
  }
  event->recorded = 1;
  event->recorded_at_ms = now_ms();
  return TB_SUCCESS;
}

static tb_status event_query(void* context, tb_event event) {
  (void)context;
  return event != NULL ? TB_SUCCESS : fail(TB_ERROR_INVALID_HANDLE, "event_query: event is NULL");
}

static tb_status event_synchronize(void* context, tb_event event) {
  return event_query(context, event);
}

static tb_status event_elapsed_time(void* context, tb_event start, tb_event end, float* milliseconds) {
  (void)context;
  if (start == NULL || end == NULL) return fail(TB_ERROR_INVALID_HANDLE, "event_elapsed_time: an event is NULL");
  if (milliseconds == NULL) return fail(TB_ERROR_INVALID_VALUE, "event_elapsed_time: milliseconds is NULL");
  if (!start->enable_timing || !end->enable_timing) {
    return fail(TB_ERROR_INVALID_VALUE, "event_elapsed_time: both events must be created with timing enabled");
  }
  if (!start->recorded || !end->recorded) {
    return fail(TB_ERROR_INVALID_VALUE, "event_elapsed_time: both events must be recorded first");
  }
  *milliseconds = (float)(end->recorded_at_ms - start->recorded_at_ms);
  return TB_SUCCESS;
}

/* ---- the table TorchBridge loads ------------------------------------------------------------ */

static const tb_runtime runtime = {
    .struct_size = sizeof(tb_runtime),
    .abi_version = TB_RUNTIME_ABI_VERSION,
    .name = "minimal",
    .context = NULL,
    .status_string = status_string,
    .last_error_message = last_error_message,
    .device_count = device_count,
    .set_device = set_device,
    .get_device = get_device,
    .device_properties = device_properties,
    .device_synchronize = device_synchronize,
    .device_malloc = device_malloc,
    .device_free = device_free,
    .host_malloc = host_malloc,
    .host_free = host_free,
    .memcpy_sync = memcpy_sync,
    .memcpy_async = memcpy_async,
    .memset_async = memset_async,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_query = stream_query,
    .stream_synchronize = stream_synchronize,
    .stream_wait_event = stream_wait_event,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_query = event_query,
    .event_synchronize = event_synchronize,
    .event_elapsed_time = event_elapsed_time,
};

/* The one exported symbol (TB_RUNTIME_ENTRY_SYMBOL); the library is libtorchbridge_device_minimal.so. */
__attribute__((visibility("default"))) const tb_runtime* tb_runtime_entry(const char** error_message) {
  (void)error_message; /* nothing can fail at start: no options, no driver */
  return &runtime;
}

/*
 * TorchBridge device SDK — the C runtime interface a hardware vendor implements.
 *
 * A vendor fills one `tb_runtime` table of function pointers; TorchBridge turns it into a complete
 * PyTorch device (PrivateUse1): guard, caching allocator, streams, events, generators, operators,
 * autocast and serialization. Plain C99, no C++ and no PyTorch types, so a vendor needs neither
 * PyTorch headers nor TorchBridge's C++ ABI.
 *
 * Versioning: `struct_size` and `abi_version` let the table grow. New entries are only ever
 * appended; TorchBridge treats an entry as absent when it lies beyond the vendor's `struct_size`.
 *
 * Conventions:
 *  - Every entry returns a tb_status. On failure the runtime should make a sentence describing
 *    this thread's last failure available through `last_error_message` (e.g. "requested 2147483648
 *    bytes on device 0, 1073741824 free").
 *  - `context` is the vendor's own state, passed back as the first argument of every entry.
 *  - Devices are numbered 0 .. count-1. "Current device" is per host thread.
 *  - Streams execute their work in the order it was queued; different streams are unordered
 *    unless joined with events. Asynchronous calls return before the work is done.
 *  - A device pointer is only meaningful to this runtime; the host may dereference it only when
 *    the device reports `host_addressable`.
 */
#ifndef TORCHBRIDGE_SDK_RUNTIME_H
#define TORCHBRIDGE_SDK_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TB_RUNTIME_ABI_VERSION 1u

/* Name of the symbol a device library exports (see tb_runtime_entry_fn). TorchBridge finds
 * device NAME in libtorchbridge_device_NAME.so. */
#define TB_RUNTIME_ENTRY_SYMBOL "tb_runtime_entry"

typedef enum tb_status {
  TB_SUCCESS = 0,
  TB_ERROR_INVALID_VALUE = 1,    /* an argument is malformed (null pointer, bad kind, ...) */
  TB_ERROR_INVALID_DEVICE = 2,   /* device index out of range */
  TB_ERROR_OUT_OF_MEMORY = 3,    /* the device (or host) cannot satisfy the allocation */
  TB_ERROR_INVALID_POINTER = 4,  /* not allocated by this runtime, or already freed */
  TB_ERROR_NOT_READY = 5,        /* query only: work is still pending (not a failure) */
  TB_ERROR_INVALID_HANDLE = 6,   /* unknown or destroyed stream/event */
  TB_ERROR_NOT_SUPPORTED = 7,    /* the runtime does not implement this */
  TB_ERROR_DEVICE_FAILURE = 8,   /* the device or driver failed */
  TB_ERROR_UNKNOWN = 99
} tb_status;

typedef enum tb_memcpy_kind {
  TB_MEMCPY_HOST_TO_DEVICE = 1,
  TB_MEMCPY_DEVICE_TO_HOST = 2,
  TB_MEMCPY_DEVICE_TO_DEVICE = 3 /* same or different devices of this runtime */
} tb_memcpy_kind;

typedef struct tb_stream_s* tb_stream; /* opaque, owned by the runtime */
/* Opaque, owned by the runtime, and never NULL: TorchBridge reads a NULL event as one never
 * recorded (nothing to wait for), so event_create handing out NULL is refused. A runtime that
 * numbers its events can hand out index + 1. */
typedef struct tb_event_s* tb_event;

/* Strings: UTF-8, NUL-terminated within their fields (a string filling its field is cut by a byte). */
typedef struct tb_device_properties {
  char name[256];
  char vendor[64];
  char architecture[64];   /* empty when not meaningful */
  char driver_version[64]; /* empty when unknown */
  uint64_t total_memory_bytes;
  uint64_t free_memory_bytes;
  int32_t multiprocessor_count; /* 0 when unknown */
  int32_t host_addressable;     /* 1: host code may read/write device pointers directly */
  int32_t is_real_hardware;     /* 0 for emulators and simulators */
} tb_device_properties;

typedef struct tb_runtime {
  uint32_t struct_size; /* sizeof(tb_runtime) as the vendor compiled it */
  uint32_t abi_version; /* TB_RUNTIME_ABI_VERSION the vendor compiled against */
  const char* name;     /* the PyTorch device name to register, e.g. "emu" (lower case) */
  void* context;

  /* Errors */
  const char* (*status_string)(void* context, tb_status status); /* never NULL */
  const char* (*last_error_message)(void* context);              /* this thread's last failure */

  /* Devices */
  tb_status (*device_count)(void* context, int32_t* count);
  tb_status (*set_device)(void* context, int32_t device);
  tb_status (*get_device)(void* context, int32_t* device);
  tb_status (*device_properties)(void* context, int32_t device, tb_device_properties* properties);
  tb_status (*device_synchronize)(void* context, int32_t device); /* waits for all its streams */

  /* Memory */
  /* Success hands out a non-NULL pointer (NULL for a non-empty allocation is refused). */
  tb_status (*device_malloc)(void* context, int32_t device, size_t bytes, void** pointer);
  tb_status (*device_free)(void* context, int32_t device, void* pointer);
  tb_status (*host_malloc)(void* context, size_t bytes, void** pointer); /* pinned host memory */
  tb_status (*host_free)(void* context, void* pointer);
  /* Synchronous copy: returns when the bytes have arrived. It does not wait for queued stream
   * work; callers order it against streams themselves. */
  tb_status (*memcpy_sync)(void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind);
  tb_status (*memcpy_async)(void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind,
                            tb_stream stream);
  tb_status (*memset_async)(void* context, void* dst, int32_t value, size_t bytes, tb_stream stream);

  /* Streams. TorchBridge creates a few per device and reuses them (one pool per priority, as
   * PyTorch does for CUDA). priority follows CUDA: 0 is the default, lower numbers run first;
   * TorchBridge asks for 0 to -3 only, and a runtime may map them onto the levels it has. */
  tb_status (*stream_create)(void* context, int32_t device, int32_t priority, tb_stream* stream);
  tb_status (*stream_destroy)(void* context, tb_stream stream);
  tb_status (*stream_query)(void* context, tb_stream stream); /* TB_SUCCESS idle, TB_ERROR_NOT_READY busy */
  tb_status (*stream_synchronize)(void* context, tb_stream stream);
  tb_status (*stream_wait_event)(void* context, tb_stream stream, tb_event event);

  /* Events */
  tb_status (*event_create)(void* context, int32_t device, int32_t enable_timing, tb_event* event);
  tb_status (*event_destroy)(void* context, tb_event event);
  tb_status (*event_record)(void* context, tb_event event, tb_stream stream);
  tb_status (*event_query)(void* context, tb_event event); /* TB_SUCCESS reached, NOT_READY pending */
  tb_status (*event_synchronize)(void* context, tb_event event);
  /* Milliseconds between two recorded, completed, timing-enabled events. */
  tb_status (*event_elapsed_time)(void* context, tb_event start, tb_event end, float* milliseconds);
} tb_runtime;

/* The entry point a device library exports (see TB_RUNTIME_ENTRY_SYMBOL). Called once per
 * process. On failure it returns NULL and points *error_message at a static sentence saying why
 * (e.g. a bad option value); it prints nothing. The library may read its own environment
 * variables for options. The returned table lives until the process exits, and so does the
 * library once its entry has run, even when registering the device fails (its threads may still
 * run its code). device_count must be at most 127, PyTorch's largest device index + 1. */
typedef const tb_runtime* (*tb_runtime_entry_fn)(const char** error_message);

#ifdef __cplusplus
}
#endif

#endif /* TORCHBRIDGE_SDK_RUNTIME_H */

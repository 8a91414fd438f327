// The C face of the emulator: tb_runtime_entry and the function table it returns. Each entry
// forwards to EmuRuntime and converts any C++ exception into a status, because no exception may
// cross the C interface.
#include "emu_runtime.h"
#include "last_error.h"
#include "options.h"

#include <torchbridge/sdk/exception_barrier.h>
#include <torchbridge/sdk/runtime.h>

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace torchbridge::emu {
namespace {

EmuRuntime& runtime_of(void* context) { return *static_cast<EmuRuntime*>(context); }

// The integer a C caller passed for an enum parameter. A C caller may pass any int, but in C++ an
// enum object holding a value outside its enumerators' range is undefined behaviour to load, so
// the bytes are read as an int and validated as one.
template <typename Enum>
int raw_value(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int));
  int raw = 0;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// One trampoline per table entry: C function pointer in, member function call out.
#define TB_EMU_FORWARD(entry, params, args)                                                       \
  tb_status entry params noexcept {                                                              \
    return sdk::call_without_exceptions<&fail>([&] { return runtime_of(context).entry args; }); \
  }

TB_EMU_FORWARD(device_count, (void* context, int32_t* count), (count))
TB_EMU_FORWARD(set_device, (void* context, int32_t device), (device))
TB_EMU_FORWARD(get_device, (void* context, int32_t* device), (device))
TB_EMU_FORWARD(device_properties, (void* context, int32_t device, tb_device_properties* properties),
               (device, properties))
TB_EMU_FORWARD(device_synchronize, (void* context, int32_t device), (device))
TB_EMU_FORWARD(device_malloc, (void* context, int32_t device, size_t bytes, void** pointer), (device, bytes, pointer))
TB_EMU_FORWARD(device_free, (void* context, int32_t device, void* pointer), (device, pointer))
TB_EMU_FORWARD(host_malloc, (void* context, size_t bytes, void** pointer), (bytes, pointer))
TB_EMU_FORWARD(host_free, (void* context, void* pointer), (pointer))
TB_EMU_FORWARD(memcpy_sync, (void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind),
               (dst, src, bytes, raw_value(kind)))
TB_EMU_FORWARD(memcpy_async,
               (void* context, void* dst, const void* src, size_t bytes, tb_memcpy_kind kind, tb_stream stream),
               (dst, src, bytes, raw_value(kind), stream))
TB_EMU_FORWARD(memset_async, (void* context, void* dst, int32_t value, size_t bytes, tb_stream stream),
               (dst, value, bytes, stream))
TB_EMU_FORWARD(stream_create, (void* context, int32_t device, int32_t priority, tb_stream* stream),
               (device, priority, stream))
TB_EMU_FORWARD(stream_destroy, (void* context, tb_stream stream), (stream))
TB_EMU_FORWARD(stream_query, (void* context, tb_stream stream), (stream))
TB_EMU_FORWARD(stream_synchronize, (void* context, tb_stream stream), (stream))
TB_EMU_FORWARD(stream_wait_event, (void* context, tb_stream stream, tb_event event), (stream, event))
TB_EMU_FORWARD(event_create, (void* context, int32_t device, int32_t enable_timing, tb_event* event),
               (device, enable_timing, event))
TB_EMU_FORWARD(event_destroy, (void* context, tb_event event), (event))
TB_EMU_FORWARD(event_record, (void* context, tb_event event, tb_stream stream), (event, stream))
TB_EMU_FORWARD(event_query, (void* context, tb_event event), (event))
TB_EMU_FORWARD(event_synchronize, (void* context, tb_event event), (event))
TB_EMU_FORWARD(event_elapsed_time, (void* context, tb_event start, tb_event end, float* milliseconds),
               (start, end, milliseconds))

#undef TB_EMU_FORWARD

const char* table_status_string(void*, tb_status status) noexcept { return status_string(raw_value(status)); }
const char* table_last_error_message(void*) noexcept { return last_error_message(); }

struct EntryResult {
  tb_runtime table{};
  const tb_runtime* returned = nullptr;  // &table on success
  std::string error;                     // lives as long as the process: *error_message points here
};

EntryResult& build_once() {
  // Built once and never destroyed: the table must outlive every caller, and tearing down stream
  // workers during static destruction at exit could block or race with threads still using it.
  static EntryResult* const result = [] {
    auto* built = new EntryResult;
    try {
      OptionsOrError options = read_options();
      if (!options.options) {
        built->error = std::move(options.error);
        return built;
      }
      std::unique_ptr<EmuRuntime> runtime = EmuRuntime::create(*options.options, built->error);
      if (!runtime) return built;

      tb_runtime& table = built->table;
      table.struct_size = sizeof(tb_runtime);
      table.abi_version = TB_RUNTIME_ABI_VERSION;
      table.name = "emu";
      table.context = runtime.release();
      table.status_string = table_status_string;
      table.last_error_message = table_last_error_message;
      table.device_count = device_count;
      table.set_device = set_device;
      table.get_device = get_device;
      table.device_properties = device_properties;
      table.device_synchronize = device_synchronize;
      table.device_malloc = device_malloc;
      table.device_free = device_free;
      table.host_malloc = host_malloc;
      table.host_free = host_free;
      table.memcpy_sync = memcpy_sync;
      table.memcpy_async = memcpy_async;
      table.memset_async = memset_async;
      table.stream_create = stream_create;
      table.stream_destroy = stream_destroy;
      table.stream_query = stream_query;
      table.stream_synchronize = stream_synchronize;
      table.stream_wait_event = stream_wait_event;
      table.event_create = event_create;
      table.event_destroy = event_destroy;
      table.event_record = event_record;
      table.event_query = event_query;
      table.event_synchronize = event_synchronize;
      table.event_elapsed_time = event_elapsed_time;
      built->returned = &table;
    } catch (const std::exception& error) {
      built->error = std::string("the emu runtime could not start: ") + error.what();
    }
    return built;
  }();
  return *result;
}

}  // namespace
}  // namespace torchbridge::emu

// The library's only exported symbol (see exports.map). Options are read on the first call; later
// calls return the same table or the same error.
extern "C" __attribute__((visibility("default"))) const tb_runtime* tb_runtime_entry(const char** error_message) {
  static_assert(std::is_same_v<decltype(&tb_runtime_entry), tb_runtime_entry_fn>,
                "tb_runtime_entry must match tb_runtime_entry_fn in runtime.h");
  torchbridge::emu::EntryResult& result = torchbridge::emu::build_once();
  if (result.returned == nullptr && error_message != nullptr) *error_message = result.error.c_str();
  return result.returned;
}

// The library's only exported symbol: builds the tb_runtime table once per process.
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "cuda_context.h"
#include "cuda_entries.h"
#include "cuda_status.h"
#include "torchbridge/sdk/exception_barrier.h"
#include "torchbridge/sdk/runtime.h"

namespace torchbridge::cuda_device {
namespace {

// PyTorch reserves "cuda" for its own device type, so this runtime registers under another name.
constexpr const char* kDeviceName = "cudasdk";

struct Runtime {
  Context context;
  tb_runtime table{};
  std::string error;  // why loading failed; empty on success. Lives until the process exits.
};

// Every entry behind the exception barrier: the entries allocate (handle tables, error sentences),
// and a C++ exception must never cross the C ABI. status_string and last_error_message only
// return stored text.
template <auto Entry>
constexpr auto guarded = &sdk::ExceptionBarrier<Entry, &report_error>::entry;

void fill_table(Runtime& runtime) {
  tb_runtime& t = runtime.table;
  t.struct_size = sizeof(tb_runtime);
  t.abi_version = TB_RUNTIME_ABI_VERSION;
  t.name = kDeviceName;
  t.context = &runtime.context;
  t.status_string = status_string;
  t.last_error_message = last_error_message;
  t.device_count = guarded<&device_count>;
  t.set_device = guarded<&set_device>;
  t.get_device = guarded<&get_device>;
  t.device_properties = guarded<&device_properties>;
  t.device_synchronize = guarded<&device_synchronize>;
  t.device_malloc = guarded<&device_malloc>;
  t.device_free = guarded<&device_free>;
  t.host_malloc = guarded<&host_malloc>;
  t.host_free = guarded<&host_free>;
  t.memcpy_sync = guarded<&memcpy_sync>;
  t.memcpy_async = guarded<&memcpy_async>;
  t.memset_async = guarded<&memset_async>;
  t.stream_create = guarded<&stream_create>;
  t.stream_destroy = guarded<&stream_destroy>;
  t.stream_query = guarded<&stream_query>;
  t.stream_synchronize = guarded<&stream_synchronize>;
  t.stream_wait_event = guarded<&stream_wait_event>;
  t.event_create = guarded<&event_create>;
  t.event_destroy = guarded<&event_destroy>;
  t.event_record = guarded<&event_record>;
  t.event_query = guarded<&event_query>;
  t.event_synchronize = guarded<&event_synchronize>;
  t.event_elapsed_time = guarded<&event_elapsed_time>;
}

// Loading succeeds only when the CUDA runtime can talk to a driver and sees at least one device,
// so that TorchBridge never registers a device type that cannot run anything. No context is
// created here: cudaGetDeviceCount only initializes the driver.
void load(Runtime& runtime) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the failure behind for unrelated CUDA users
    runtime.error = std::string("CUDA runtime: cudaGetDeviceCount failed: ") +
                    cudaGetErrorString(error) + " (" + cudaGetErrorName(error) + ")";
    return;
  }
  if (count <= 0) {
    runtime.error = "CUDA runtime: no CUDA device found (cudaGetDeviceCount reported 0 devices)";
    return;
  }
  runtime.context.device_count = count;
  fill_table(runtime);
}

}  // namespace
}  // namespace torchbridge::cuda_device

extern "C" __attribute__((visibility("default"))) const tb_runtime* tb_runtime_entry(
    const char** error_message) {
  using torchbridge::cuda_device::Runtime;
  // Never destroyed: the SDK keeps the table (and the error sentence) until the process exits,
  // possibly longer than this library's own static destructors would let them live.
  static Runtime* runtime = new Runtime();
  static std::once_flag loaded;
  try {  // the loader allocates its sentences; no exception may leave through the C ABI
    std::call_once(loaded, [] { torchbridge::cuda_device::load(*runtime); });
  } catch (...) {
    if (error_message != nullptr) *error_message = "CUDA runtime: out of host memory while loading";
    return nullptr;
  }
  if (!runtime->error.empty()) {
    if (error_message != nullptr) *error_message = runtime->error.c_str();
    return nullptr;
  }
  return &runtime->table;
}

// The exported symbol must keep the SDK's signature; a mismatch fails here, not at dlsym time.
static_assert(
    std::is_same_v<decltype(&tb_runtime_entry), tb_runtime_entry_fn>,
    "tb_runtime_entry must match tb_runtime_entry_fn");

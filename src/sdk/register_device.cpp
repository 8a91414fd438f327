// One call turns a vendor runtime table into PyTorch's PrivateUse1 device; load_device() finds
// the table in a device library. The backend registry asks load_device() for unknown names, so
// `create_backend("emu")` or `torchbridge info --backend emu` loads the device with no other step.
#include <torchbridge/sdk/device.h>

#include "core/dynamic_library.h"
#include "sdk/autograd_probe.h"
#include "sdk/caching_allocator.h"
#include "sdk/generator.h"
#include "sdk/guard_impl.h"
#include "sdk/hooks.h"
#include "sdk/host_allocator.h"
#include "sdk/in_place_fallback.h"
#include "sdk/registration.h"
#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/privateuse1.h>
#include <torchbridge/registry.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

std::recursive_mutex registration_mutex;
const tb_runtime* registered_table = nullptr;
// Set once, when the device was registered after the process's first backward pass.
std::optional<std::string> autograd_refusal_reason;
// The device whose registration failed after torch's registrations had begun, if one did.
std::optional<std::string> failed_registration;
// Each library's entry result, by path: the entry runs once per process (runtime.h).
std::map<std::string, std::pair<const tb_runtime*, std::string>> entered;

void refuse_after_a_failed_registration() {
  TORCH_CHECK(!failed_registration, "registering SDK device '", failed_registration.value_or(""),
              "' failed earlier in this process, after PyTorch's registrations had begun, which cannot be undone; "
              "no SDK device can be registered in this process again: restart it");
}

// Every entry TorchBridge calls, with its offset, so a table that is too short or has a NULL
// entry is rejected naming the entry instead of crashing later.
#define TB_ENTRY(NAME) {#NAME, offsetof(tb_runtime, NAME)}
const std::pair<const char*, size_t> kRequiredEntries[] = {
    TB_ENTRY(status_string),    TB_ENTRY(last_error_message), TB_ENTRY(device_count),
    TB_ENTRY(set_device),       TB_ENTRY(get_device),         TB_ENTRY(device_properties),
    TB_ENTRY(device_synchronize), TB_ENTRY(device_malloc),    TB_ENTRY(device_free),
    TB_ENTRY(host_malloc),      TB_ENTRY(host_free),          TB_ENTRY(memcpy_sync),
    TB_ENTRY(memcpy_async),     TB_ENTRY(memset_async),       TB_ENTRY(stream_create),
    TB_ENTRY(stream_destroy),   TB_ENTRY(stream_query),       TB_ENTRY(stream_synchronize),
    TB_ENTRY(stream_wait_event), TB_ENTRY(event_create),      TB_ENTRY(event_destroy),
    TB_ENTRY(event_record),     TB_ENTRY(event_query),        TB_ENTRY(event_synchronize),
    TB_ENTRY(event_elapsed_time)};
#undef TB_ENTRY

// A device name becomes a file name (libtorchbridge_device_NAME.so) and torch's PrivateUse1
// backend name, so it must be lower-case letters and underscores: [a-z][a-z_]*. No digits: torch's
// device-string parser reads letters and '_' only, so "acme2:0" was an invalid device string after
// "acme2" had taken the PrivateUse1 slot. Checked by a loop, not a
// std::regex: the regex that stood here ran before most of the Python-only crashes of the first
// H100 run (docs/device-sdk.md, "The Python-only crash of the GPU runs").
bool is_device_name(const std::string& name) {
  const auto lower = [](char c) { return c >= 'a' && c <= 'z'; };
  return !name.empty() && lower(name.front()) &&
         std::all_of(name.begin(), name.end(), [&](char c) { return lower(c) || c == '_'; });
}

void validate_name(const std::string& name) {
  TORCH_CHECK_VALUE(is_device_name(name), "invalid device name '", name,
                    "': expected lower-case letters and underscores, such as 'emu' or 'my_chip' (torch's device "
                    "strings take no digits)");
  // A name torch already gives a device type ("meta", "hpu") half-registered: torch refused its
  // module, but the backend was renamed, and torch.empty(device="meta") allocated on the runtime.
  for (int8_t type = 0; type < static_cast<int8_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES); ++type) {
    const auto device_type = static_cast<c10::DeviceType>(type);
    if (device_type == c10::DeviceType::PrivateUse1 || !c10::isValidDeviceType(device_type)) continue;
    TORCH_CHECK_VALUE(name != c10::DeviceTypeName(device_type, /*lower_case=*/true), "invalid device name '", name,
                      "': torch already names a device type so; choose another name");
  }
}

void validate_table(const tb_runtime* table) {
  TORCH_CHECK_VALUE(table != nullptr, "register_runtime: the runtime table is NULL");
  TORCH_CHECK_VALUE(table->abi_version == TB_RUNTIME_ABI_VERSION, "runtime '",
                    table->name ? table->name : "?", "' was built for SDK ABI version ", table->abi_version,
                    "; this TorchBridge speaks version ", TB_RUNTIME_ABI_VERSION);
  TORCH_CHECK_VALUE(table->name != nullptr, "register_runtime: the runtime has no name");
  validate_name(table->name);
  for (const auto& [entry, offset] : kRequiredEntries) {
    TORCH_CHECK_VALUE(offset + sizeof(void*) <= table->struct_size, "runtime '", table->name,
                      "' is missing entry ", entry, " (its table is ", table->struct_size, " bytes)");
    void* pointer = nullptr;
    std::memcpy(&pointer, reinterpret_cast<const char*>(table) + offset, sizeof(pointer));
    TORCH_CHECK_VALUE(pointer != nullptr, "runtime '", table->name, "' leaves entry ", entry, " NULL");
  }
}

void declare_to_backend_layer(const std::string& vendor, bool real_hardware) {
  PrivateUse1Declaration declaration;
  declaration.vendor = vendor;
  declaration.is_real_hardware = real_hardware;
  declaration.describe = [](int index, DeviceInfo& info) {
    const tb_device_properties props = runtime().properties(index);
    info.name = props.name;
    info.architecture = props.architecture;
    info.driver_version = props.driver_version;
    info.total_memory_bytes = props.total_memory_bytes;
    info.free_memory_bytes = props.free_memory_bytes;
    if (props.multiprocessor_count > 0) info.multiprocessor_count = props.multiprocessor_count;
    info.features.unified_memory = props.host_addressable != 0;
  };
  declare_privateuse1_device(declaration);
}

std::vector<std::string> search_directories() {
  std::vector<std::string> directories;
  if (const char* extra = std::getenv(kDevicePathEnvVar)) {
    std::stringstream list(extra);
    for (std::string dir; std::getline(list, dir, ':');) {
      if (!dir.empty()) directories.push_back(dir);
    }
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&load_device), &info) != 0 && info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    directories.push_back(self.substr(0, self.find_last_of('/')));
  }
  return directories;
}

std::string library_file(const std::string& name) { return "libtorchbridge_device_" + name + ".so"; }

std::optional<std::string> find_library(const std::string& name) {
  for (const auto& dir : search_directories()) {
    const std::string path = dir + "/" + library_file(name);
    std::error_code error;
    if (std::filesystem::exists(path, error)) return path;
  }
  return std::nullopt;
}

// The backend registry consults this for names it does not know, so that create_backend("emu")
// loads the emu device library on demand. The registry sits in a lower layer than the SDK and may
// not call it, so the SDK hands the registry a callback — an inversion of control, installed when
// libtorchbridge is loaded because the SDK lives in that same library: any program that can call
// create_backend() has this installed, without an init call to forget. It is safe at static-init
// time: BackendRegistry::instance() is a function-local static, built on first use, and the
// callback only runs when a name is looked up, after static initialisation.
const bool resolver_installed = [] {
  BackendRegistry::instance().set_name_resolver(
      [](const std::string& name) {
        if (!is_device_name(name) || !find_library(name)) return false;
        load_device(name);
        return true;
      },
      &available_devices);
  return true;
}();

// Registers `table` under the lock; true when this call registered it (false: it already was).
bool register_runtime_locked(const tb_runtime* table) {
  std::lock_guard<std::recursive_mutex> lock(registration_mutex);
  refuse_after_a_failed_registration();
  validate_table(table);
  const std::string name = table->name;
  if (registered_table == table) return false;
  TORCH_CHECK(registered_table == nullptr, "PyTorch has a single PrivateUse1 slot and it already holds SDK device '",
              registered_table ? registered_table->name : "", "'; cannot also register '", name, "'");
  TORCH_CHECK(!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1),
              "PyTorch's single PrivateUse1 slot is already taken by another plugin ('",
              c10::get_privateuse1_backend(), "'); cannot register '", name, "'");
  if (c10::is_privateuse1_backend_registered()) {
    TORCH_CHECK(c10::get_privateuse1_backend() == name, "PrivateUse1 was already renamed to '",
                c10::get_privateuse1_backend(), "'; cannot register device '", name, "'");
  }
  check_sdk_device_may_register(name);

  set_runtime(table);
  const int count = runtime().device_count();
  TORCH_CHECK(count > 0, "device '", name, "' reports no devices");
  TORCH_CHECK(count <= std::numeric_limits<c10::DeviceIndex>::max(), "device '", name, "' reports ", count,
              " devices; PyTorch numbers at most ", int(std::numeric_limits<c10::DeviceIndex>::max()));
  const tb_device_properties first = runtime().properties(0);

  // From here on torch's registrations and the registries' state cannot be undone: a failure
  // leaves the process unable to register an SDK device again (a retry reused half-built streams:
  // crashes, or one device's work on another's streams), which the next attempt is told.
  struct FailureRecorder {
    const std::string& name;
    bool done = false;
    ~FailureRecorder() {
      if (!done) failed_registration = name;
    }
  } recorder{name};
  if (!c10::is_privateuse1_backend_registered()) c10::register_privateuse1_backend(name);
  caching_allocator().init(count);
  init_streams(count);
  init_generators(count);
  init_host_addressable(count);
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &caching_allocator());
  register_host_allocator();
  static auto* guard_registrar =
      new c10::impl::DeviceGuardImplRegistrar(c10::DeviceType::PrivateUse1, make_guard_impl());
  (void)guard_registrar;
  at::RegisterPrivateUse1HooksInterface(make_hooks());
  register_native_ops();
  register_elementwise_fast_path();
  register_copy_math_bits();
  register_convolution();
  register_batch_norm();
  register_dropout();
  register_to_copy();
  register_rnn_cells();
  register_record_stream();
  register_cpu_fallback();
  register_sparse();
  register_quantized_refusal();
  register_nested_refusal();
  register_autocast();
  register_profiler_stubs();
  declare_to_backend_layer(first.vendor, first.is_real_hardware != 0);
  registered_table = table;
  recorder.done = true;
  return true;
}

// Asks autograd whether it serves the device just registered, after the registration lock is
// released (asking may start autograd's device threads, which set themselves up through the
// device's guard while this thread waits for them), and warns when it does not: loading still
// succeeds, since forward passes work, but never silently.
void check_autograd_serves(const std::string& name) {
  auto reason = autograd_cannot_serve(name, runtime().device_count());
  if (!reason) return;
  {
    std::lock_guard<std::recursive_mutex> lock(registration_mutex);
    autograd_refusal_reason = reason;
  }
  TORCH_WARN(*reason);
}

// Loads and registers device `name`; true when this call registered it.
bool load_device_locked(const std::string& name) {
  validate_name(name);
  std::lock_guard<std::recursive_mutex> lock(registration_mutex);
  if (registered_table != nullptr && name == registered_table->name) return false;
  const auto path = find_library(name);
  std::string searched;
  for (const auto& dir : search_directories()) searched += " " + dir;
  TORCH_CHECK(path.has_value(), "no device library ", library_file(name), " found (searched", searched,
              "; set ", kDevicePathEnvVar, " to add directories)");
  refuse_after_a_failed_registration();
  auto known = entered.find(*path);
  if (known == entered.end()) {
    DynamicLibrary library(path->c_str());  // closed again if it is not a device library
    TORCH_CHECK(library.loaded(), "cannot load device library ", *path, ": ", library.load_error());
    const auto entry = library.function<tb_runtime_entry_fn>(TB_RUNTIME_ENTRY_SYMBOL);
    TORCH_CHECK(entry != nullptr, "device library ", *path, " does not export ", TB_RUNTIME_ENTRY_SYMBOL);
    // Kept from here on, whatever follows: the entry may start threads that run the library's code
    // (unloaded after a refused registration, such a thread crashed the process).
    library.keep_for_process();
    const char* error = nullptr;
    const tb_runtime* table = entry(&error);
    known = entered.emplace(*path, std::make_pair(table, std::string(error ? error : "(no reason given)"))).first;
  }
  const auto& [table, error] = known->second;
  TORCH_CHECK(table != nullptr, "device '", name, "' failed to start: ", error,
              " (its library's entry runs once per process: restart it to try again)");
  TORCH_CHECK(table->name != nullptr && name == table->name, "device library ", *path, " registers '",
              table->name ? table->name : "", "', not '", name, "'");
  return register_runtime_locked(table);
}

}  // namespace

void register_runtime(const tb_runtime* table) {
  if (register_runtime_locked(table)) check_autograd_serves(table->name);
}

void load_device(const std::string& name) {
  if (load_device_locked(name)) check_autograd_serves(name);
}

std::optional<std::string> autograd_refusal() {
  std::lock_guard<std::recursive_mutex> lock(registration_mutex);
  return autograd_refusal_reason;
}

std::vector<std::string> available_devices() {
  std::set<std::string> names;
  const std::string prefix = "libtorchbridge_device_";
  for (const auto& dir : search_directories()) {
    std::error_code error;  // a directory that is missing or unreadable lists nothing
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      const std::string file = entry.path().filename().string();
      if (file.rfind(prefix, 0) == 0 && file.size() > prefix.size() + 3 && file.substr(file.size() - 3) == ".so") {
        names.insert(file.substr(prefix.size(), file.size() - prefix.size() - 3));
      }
    }
  }
  return {names.begin(), names.end()};
}

std::optional<std::string> registered_device() {
  std::lock_guard<std::recursive_mutex> lock(registration_mutex);
  if (registered_table == nullptr) return std::nullopt;
  return std::string(registered_table->name);
}

}  // namespace torchbridge::sdk

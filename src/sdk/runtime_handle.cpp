#include "sdk/runtime_handle.h"

#include "sdk/runtime_text.h"

#include <pthread.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace torchbridge::sdk {
namespace {
// NULL is this interface's "never recorded": waits on it would return at once, unordered, and the
// caching allocator would reuse memory a stream still uses.
constexpr const char* kNullEventRefusal =
    "event_create returned a NULL event handle, which TorchBridge reads as an event never recorded; event handles "
    "must be non-NULL (a runtime that numbers its events can hand out index + 1)";

std::unique_ptr<RuntimeHandle> registered;
std::unique_ptr<std::string> registered_name;
std::atomic<bool> forked_child{false};

// A forked child inherits the runtime's memory but none of its threads (stream workers, driver
// threads), so any use would hang or corrupt state. It raises instead, like CUDA's "bad fork".
void mark_forked_child() { forked_child = true; }
}  // namespace

bool in_bad_fork() { return forked_child; }

const std::string& RuntimeHandle::name() const { return *registered_name; }

std::string RuntimeHandle::describe(tb_status status) const {
  // status_string is documented never NULL; one that is must not turn the runtime's error into
  // std::logic_error (which aborted the process where a deleter warns).
  const char* name = table_->status_string(table_->context, status);
  std::string text = name != nullptr ? runtime_message(name) : "status " + std::to_string(static_cast<int>(status));
  const std::string detail = runtime_message(table_->last_error_message(table_->context));
  if (!detail.empty()) text += ": " + detail;
  return text;
}

void RuntimeHandle::check(tb_status status, const char* call) const {
  if (status == TB_SUCCESS) return;
  const std::string message = describe(status);
  TORCH_CHECK_WITH(OutOfMemoryError, status != TB_ERROR_OUT_OF_MEMORY, "device '", *registered_name,
                   "': ", call, " failed: ", message);
  TORCH_CHECK(false, "device '", *registered_name, "': runtime call ", call, " failed: ", message);
}

bool RuntimeHandle::warn_unless_success(tb_status status, const char* call) const {
  if (status == TB_SUCCESS) return true;
  TORCH_WARN("device '", *registered_name, "': runtime call ", call, " failed: ", describe(status));
  return false;
}

void RuntimeHandle::check_allocation(const void* pointer, size_t bytes, const char* call) const {
  TORCH_CHECK(pointer != nullptr || bytes == 0, "device '", *registered_name, "': ", call, " returned success but a ",
              "NULL pointer for ", bytes, " bytes; a runtime hands out memory or returns TB_ERROR_OUT_OF_MEMORY");
}

tb_event RuntimeHandle::create_event(int32_t device, int32_t enable_timing) const {
  tb_event event = nullptr;
  check(table_->event_create(table_->context, device, enable_timing, &event), "event_create");
  TORCH_CHECK(event != nullptr, "device '", *registered_name, "': ", kNullEventRefusal);
  return event;
}

tb_event RuntimeHandle::create_event_or_warn(int32_t device, int32_t enable_timing) const {
  tb_event event = nullptr;
  if (!warn_unless_success(table_->event_create(table_->context, device, enable_timing, &event), "event_create")) {
    return nullptr;
  }
  if (event == nullptr) TORCH_WARN("device '", *registered_name, "': ", kNullEventRefusal);
  return event;
}

bool RuntimeHandle::event_completed(tb_event event) const {
  const tb_status status = table_->event_query(table_->context, event);
  if (status == TB_ERROR_NOT_READY) return false;
  check(status, "event_query");
  return true;
}

int RuntimeHandle::device_count() const {
  int32_t count = 0;
  check(table_->device_count(table_->context, &count), "device_count");
  return count;
}

tb_device_properties RuntimeHandle::properties(int device) const {
  tb_device_properties props{};
  check(table_->device_properties(table_->context, device, &props), "device_properties");
  make_field_text(props.name, sizeof(props.name));
  make_field_text(props.vendor, sizeof(props.vendor));
  make_field_text(props.architecture, sizeof(props.architecture));
  make_field_text(props.driver_version, sizeof(props.driver_version));
  return props;
}

const RuntimeHandle& runtime() {
  TORCH_CHECK(registered != nullptr, "no TorchBridge SDK device is registered in this process");
  TORCH_CHECK(!forked_child, "device '", *registered_name, "' cannot be used in a forked child process: its "
              "runtime was initialized in the parent. Use the 'spawn' or 'forkserver' multiprocessing start "
              "method (e.g. DataLoader(multiprocessing_context='spawn')) to use the device in subprocesses");
  return *registered;
}

bool has_runtime() { return registered != nullptr; }

void set_runtime(const tb_runtime* table) {
  registered_name = std::make_unique<std::string>(table->name);
  registered = std::make_unique<RuntimeHandle>(table);
  pthread_atfork(nullptr, nullptr, &mark_forked_child);
}

}  // namespace torchbridge::sdk

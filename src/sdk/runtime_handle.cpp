#include "sdk/runtime_handle.h"

#include <pthread.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace torchbridge::sdk {
namespace {
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
  std::string text = table_->status_string(table_->context, status);
  const char* detail = table_->last_error_message(table_->context);
  if (detail != nullptr && *detail != '\0') text += ": " + std::string(detail);
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

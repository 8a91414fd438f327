#pragma once
// The registered vendor runtime, with every call checked: a failed tb_status becomes a c10::Error
// carrying the runtime's own message. Internal to the SDK glue.

#include <torchbridge/sdk/device.h>
#include <torchbridge/sdk/runtime.h>

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace torchbridge::sdk {

class RuntimeHandle {
 public:
  explicit RuntimeHandle(const tb_runtime* table) : table_(table) {}

  const tb_runtime& table() const { return *table_; }
  void* context() const { return table_->context; }
  const std::string& name() const;

  // Raises c10::Error naming the call, the status and the runtime's message unless `status` is
  // TB_SUCCESS (out-of-memory raises c10::OutOfMemoryError).
  void check(tb_status status, const char* call) const;
  std::string describe(tb_status status) const;
  // For paths that must not raise (deleters, which run inside destructors): a failed status
  // becomes a warning naming the call and the runtime's message, as c10's CUDA allocator does
  // for a failed free there. Returns whether the call succeeded.
  bool warn_unless_success(tb_status status, const char* call) const;
  // Raises unless `pointer` (what `call` handed out for `bytes` bytes, after it returned success)
  // is memory: a NULL for a non-empty allocation became a tensor whose first write crashed.
  void check_allocation(const void* pointer, size_t bytes, const char* call) const;
  // event_create, checked: a failure or a NULL handle raises.
  tb_event create_event(int32_t device, int32_t enable_timing) const;
  // The same for paths that must not raise: a failure or a NULL handle warns and gives NULL.
  tb_event create_event_or_warn(int32_t device, int32_t enable_timing) const;
  // Whether `event` has completed. A failed query is neither yes nor no: it raises.
  bool event_completed(tb_event event) const;

  // Calls the table entry `entry` with this runtime's context and checks the result.
  template <typename... Params, typename... Args>
  void call(tb_status (*tb_runtime::*entry)(void*, Params...), const char* name, Args&&... args) const {
    check((table_->*entry)(table_->context, std::forward<Args>(args)...), name);
  }

  int device_count() const;
  // The device's properties, their strings NUL-terminated within their fields and valid UTF-8.
  tb_device_properties properties(int device) const;

 private:
  const tb_runtime* table_;
};

// The runtime registered in this process; raises when none is.
const RuntimeHandle& runtime();
bool has_runtime();
// (in_bad_fork() is declared in <torchbridge/sdk/device.h>.)
void set_runtime(const tb_runtime* table);

// Calls entry ENTRY of the registered runtime with its context and checks the result.
#define TB_CALL(ENTRY, ...) ::torchbridge::sdk::runtime().call(&tb_runtime::ENTRY, #ENTRY, __VA_ARGS__)
// The same for paths that must not raise: a failure is a warning; evaluates to whether it succeeded.
#define TB_CALL_OR_WARN(ENTRY, ...)                                                                           \
  ::torchbridge::sdk::runtime().warn_unless_success(                                                        \
      ::torchbridge::sdk::runtime().table().ENTRY(::torchbridge::sdk::runtime().context(), __VA_ARGS__), #ENTRY)

}  // namespace torchbridge::sdk

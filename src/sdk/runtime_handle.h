#pragma once
// The registered vendor runtime, with every call checked: a failed tb_status becomes a c10::Error
// carrying the runtime's own message. Internal to the SDK glue.

#include <torchbridge/sdk/device.h>
#include <torchbridge/sdk/runtime.h>

#include <c10/util/Exception.h>

#include <string>

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

  int device_count() const;
  tb_device_properties properties(int device) const;

 private:
  const tb_runtime* table_;
};

// The runtime registered in this process; raises when none is.
const RuntimeHandle& runtime();
bool has_runtime();
// (in_bad_fork() is declared in <torchbridge/sdk/device.h>.)
void set_runtime(const tb_runtime* table);

// Calls `table().ENTRY(context(), args...)` and checks the result.
#define TB_CALL(ENTRY, ...) \
  ::torchbridge::sdk::runtime().check(      \
      ::torchbridge::sdk::runtime().table().ENTRY(::torchbridge::sdk::runtime().context(), __VA_ARGS__), #ENTRY)

}  // namespace torchbridge::sdk

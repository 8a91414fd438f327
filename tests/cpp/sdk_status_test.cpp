// Every runtime status the SDK glue receives is acted on: in the allocators' free paths, which run
// inside destructors and must not raise, a failure is a warning naming the call and memory a
// stream may still use is never handed out again; where the caller can act, it raises.
//
// The process registers emu through a table whose entries can be told to fail, so this is its own
// executable: a process holds one SDK device.
#include <torchbridge/backend.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>
#include <torchbridge/sdk/exception_barrier.h>
#include <torchbridge/sdk/runtime.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "collect_warnings.h"
#include "error_message.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <system_error>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

using test_support::error_of;

const tb_runtime* emu_table = nullptr;
std::atomic<bool> fail_host_free{false};
std::atomic<bool> fail_event_create{false};
std::atomic<bool> fail_event_query{false};
std::atomic<bool> fail_stream_synchronize{false};
std::atomic<bool> null_event_create{false};  // succeeds, handing out a NULL handle
std::atomic<bool> null_device_malloc{false};  // succeeds, handing out NULL memory
std::atomic<bool> null_host_malloc{false};
std::atomic<bool> null_status_string{false};  // breaks its "never NULL" promise
std::atomic<bool> latin1_error_message{false};  // a driver message in its locale's encoding
std::atomic<bool> unterminated_properties{false};  // strings that fill their fields, no NUL

tb_status host_free(void* context, void* pointer) {
  return fail_host_free ? TB_ERROR_DEVICE_FAILURE : emu_table->host_free(context, pointer);
}
tb_status event_create(void* context, int32_t device, int32_t enable_timing, tb_event* event) {
  if (null_event_create) {
    *event = nullptr;
    return TB_SUCCESS;
  }
  return fail_event_create ? TB_ERROR_DEVICE_FAILURE : emu_table->event_create(context, device, enable_timing, event);
}
tb_status event_query(void* context, tb_event event) {
  return fail_event_query ? TB_ERROR_DEVICE_FAILURE : emu_table->event_query(context, event);
}
tb_status stream_synchronize(void* context, tb_stream stream) {
  return fail_stream_synchronize ? TB_ERROR_DEVICE_FAILURE : emu_table->stream_synchronize(context, stream);
}

tb_status device_malloc(void* context, int32_t device, size_t bytes, void** pointer) {
  if (null_device_malloc) {
    *pointer = nullptr;
    return TB_SUCCESS;
  }
  return emu_table->device_malloc(context, device, bytes, pointer);
}
tb_status host_malloc(void* context, size_t bytes, void** pointer) {
  if (null_host_malloc) {
    *pointer = nullptr;
    return TB_SUCCESS;
  }
  return emu_table->host_malloc(context, bytes, pointer);
}
const char* status_string(void* context, tb_status status) {
  return null_status_string ? nullptr : emu_table->status_string(context, status);
}
const char* last_error_message(void* context) {
  return latin1_error_message ? "pilote: \xE9" "chec \xFF" : emu_table->last_error_message(context);
}
tb_status device_properties(void* context, int32_t device, tb_device_properties* properties) {
  const tb_status status = emu_table->device_properties(context, device, properties);
  if (unterminated_properties) {
    std::memset(properties->name, 'N', sizeof(properties->name));
    std::memset(properties->vendor, 'V', sizeof(properties->vendor));
    std::memcpy(properties->architecture, "arch \xE9\xFF", 8);  // Latin-1 bytes, not UTF-8
  }
  return status;
}

// emu, with the entries above in front of its own.
c10::Device failing_emu() {
  static const c10::Device device = [] {
    void* library = dlopen(TORCHBRIDGE_EMU_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(library != nullptr, dlerror());
    const char* error = nullptr;
    emu_table = reinterpret_cast<tb_runtime_entry_fn>(dlsym(library, TB_RUNTIME_ENTRY_SYMBOL))(&error);
    TORCH_CHECK(emu_table != nullptr, error);
    static tb_runtime wrapped = *emu_table;
    wrapped.host_free = &host_free;
    wrapped.event_create = &event_create;
    wrapped.event_query = &event_query;
    wrapped.stream_synchronize = &stream_synchronize;
    wrapped.device_malloc = &device_malloc;
    wrapped.host_malloc = &host_malloc;
    wrapped.status_string = &status_string;
    wrapped.last_error_message = &last_error_message;
    wrapped.device_properties = &device_properties;
    register_runtime(&wrapped);
    return c10::Device(c10::DeviceType::PrivateUse1, 0);
  }();
  return device;
}

using Warnings = test_support::CollectWarnings;

// A device tensor another stream has used: freeing it needs an event on that stream.
at::Tensor used_on_another_stream(const c10::Device& device) {
  at::Tensor t = at::empty({1 << 18}, at::TensorOptions().device(device));
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  const c10::Stream other = guard.getStreamFromGlobalPool(device);
  t.record_stream(other);
  return t;
}

TEST(SdkStatus, AFailedHostFreeIsAWarningNamingIt) {
  const c10::Device device = failing_emu();
  at::Tensor pinned = at::ones({4096}).pin_memory(device);
  ASSERT_TRUE(pinned.is_pinned(device));
  const Warnings warnings;
  fail_host_free = true;
  pinned.reset();  // the deleter frees through the runtime, which fails: a warning, no exception
  fail_host_free = false;
  EXPECT_TRUE(warnings.any_contains("runtime call host_free failed")) << warnings.joined();
}

TEST(SdkStatus, FreeingWithoutAnEventWaitsForTheStreamInstead) {
  const c10::Device device = failing_emu();
  at::Tensor t = used_on_another_stream(device);
  const Warnings warnings;
  fail_event_create = true;
  t.reset();  // was: the deleter raised and the process terminated
  fail_event_create = false;
  EXPECT_TRUE(warnings.any_contains("runtime call event_create failed")) << warnings.joined();
  EXPECT_NO_THROW(at::empty({1 << 18}, at::TensorOptions().device(device)).fill_(1.0));
}

TEST(SdkStatus, MemoryNoStreamCanBeFencedIsNeverReused) {
  const c10::Device device = failing_emu();
  at::Tensor t = used_on_another_stream(device);
  void* const address = t.data_ptr();
  const Warnings warnings;
  fail_event_create = true;
  fail_stream_synchronize = true;
  t.reset();
  fail_event_create = false;
  fail_stream_synchronize = false;
  EXPECT_TRUE(warnings.any_contains("stay unused for the rest of the process")) << warnings.joined();
  for (int i = 0; i < 4; ++i) {  // the same size again, several times: never the fenced-off block
    const at::Tensor again = at::empty({1 << 18}, at::TensorOptions().device(device));
    EXPECT_NE(again.data_ptr(), address);
  }
}

TEST(SdkStatus, AFailedEventQueryIsAnErrorNotACompletedEvent) {
  const c10::Device device = failing_emu();
  at::Tensor t = used_on_another_stream(device);
  t.reset();  // waits for an event before the memory is reused
  fail_event_query = true;
  const std::string message = error_of([&] { at::empty({16}, at::TensorOptions().device(device)); });
  fail_event_query = false;
  EXPECT_NE(message.find("runtime call event_query failed"), std::string::npos) << message;
  EXPECT_NO_THROW(at::empty({16}, at::TensorOptions().device(device)));
}

// NULL is the glue's "never recorded": a runtime handing it out (one that numbers its events from
// 0) made every wait on that event return at once, and a synchronised result read 1000 for 0.
TEST(SdkStatus, ANullEventHandleIsRefusedNotTakenForAnEventNeverRecorded) {
  const c10::Device device = failing_emu();
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  null_event_create = true;
  const std::string message = error_of([&] {
    c10::Event event(c10::DeviceType::PrivateUse1);
    event.record(guard.getStream(device));
  });
  null_event_create = false;
  EXPECT_NE(message.find("event_create returned a NULL event handle"), std::string::npos) << message;
}

// The same NULL on the paths other than torch.Event: a pinned non-blocking copy and the profiler
// passed it to event_record (a segfault in a vendor's runtime), and the caching allocator kept it
// as a fence that never holds, handing out memory a stream still used.
TEST(SdkStatus, ANullEventHandleIsRefusedOnEveryPath) {
  const c10::Device device = failing_emu();
  const at::Tensor pinned = at::ones({1024}).pin_memory(device);
  null_event_create = true;
  const std::string copy = error_of([&] { (void)pinned.to(device, /*non_blocking=*/true); });
  EXPECT_NE(copy.find("event_create returned a NULL event handle"), std::string::npos) << copy;
  at::Tensor t = used_on_another_stream(device);
  const Warnings warnings;
  t.reset();  // no event: the free waits for the other stream instead
  null_event_create = false;
  EXPECT_TRUE(warnings.any_contains("event_create returned a NULL event handle")) << warnings.joined();
  EXPECT_NO_THROW(at::empty({1 << 18}, at::TensorOptions().device(device)).fill_(1.0));
}

// Success with a NULL pointer became a tensor whose first write killed the process.
TEST(SdkStatus, MemoryHandedOutAsNullIsRefusedNamingTheEntry) {
  const c10::Device device = failing_emu();
  null_device_malloc = true;
  const std::string device_memory = error_of([&] { at::empty({1 << 22}, at::TensorOptions().device(device)); });
  null_device_malloc = false;
  EXPECT_NE(device_memory.find("device_malloc returned success but a NULL pointer"), std::string::npos)
      << device_memory;
  null_host_malloc = true;
  const std::string host_memory = error_of([&] { at::ones({4099}).pin_memory(device); });
  null_host_malloc = false;
  EXPECT_NE(host_memory.find("host_malloc returned success but a NULL pointer for 16396 bytes"), std::string::npos)
      << host_memory;
}

// A NULL status_string lost the runtime's message to std::logic_error, and aborted the process
// where a deleter warns; bytes that are not UTF-8 cost Python the whole message.
TEST(SdkStatus, TheRuntimesMessageSurvivesANullStatusStringAndNonUtf8Bytes) {
  const c10::Device device = failing_emu();
  at::Tensor t = used_on_another_stream(device);
  t.reset();  // the next allocation asks whether the freed block's event has completed
  null_status_string = true;
  latin1_error_message = true;
  fail_event_query = true;
  const std::string message = error_of([&] { at::empty({16}, at::TensorOptions().device(device)); });
  fail_event_query = false;
  at::Tensor pinned = at::ones({64}).pin_memory(device);
  const Warnings warnings;
  fail_host_free = true;
  pinned.reset();  // a warning in a deleter: was std::terminate
  fail_host_free = false;
  null_status_string = false;
  latin1_error_message = false;
  EXPECT_NE(message.find("event_query failed: status 8: pilote: \\xE9chec \\xFF"), std::string::npos) << message;
  EXPECT_TRUE(warnings.any_contains("runtime call host_free failed: status 8")) << warnings.joined();
}

// Strings filling their fields were read on into the next field (a 448-character name), and
// Latin-1 bytes broke Python's get_device_name and `info --json`.
TEST(SdkStatus, PropertyStringsStayInTheirFieldsAndAreUtf8) {
  failing_emu();
  unterminated_properties = true;
  const DeviceInfo info = create_backend("emu")->info(0);
  unterminated_properties = false;
  EXPECT_EQ(info.name, std::string(255, 'N'));
  EXPECT_EQ(info.architecture, "arch ??");
}

// A name torch gives a device type half-registered ("meta": torch.empty(device="meta") then
// allocated on the runtime). Refused before anything else, so this process's emu is untouched.
TEST(SdkStatus, ARuntimeNamedLikeATorchDeviceTypeIsRefused) {
  failing_emu();
  for (const char* name : {"meta", "hpu", "xla", "mps"}) {
    tb_runtime renamed = *emu_table;
    renamed.name = name;
    const std::string message = error_of([&] { register_runtime(&renamed); });
    EXPECT_NE(message.find(std::string("invalid device name '") + name + "': torch already names a device type so"),
              std::string::npos)
        << message;
  }
}

// The barrier every C++ runtime (emu, cudasdk) puts in front of its entries.
std::string reported;
tb_status record(tb_status status, std::string message) {
  reported = std::move(message);
  return status;
}
int thrown = 0;  // which exception `entry` throws: 0 none
tb_status entry(int32_t value, int32_t* out) {
  switch (thrown) {
    case 1: throw std::bad_alloc();
    case 2: throw std::system_error(std::make_error_code(std::errc::io_error), "reading the device");
    case 3: throw std::runtime_error("handle table corrupt");
    case 4: throw 42;
    default: *out = value * 2; return TB_SUCCESS;
  }
}

TEST(SdkExceptionBarrier, NoExceptionCrossesTheCAbi) {
  constexpr auto guarded = &ExceptionBarrier<&entry, &record>::entry;
  static_assert(noexcept(guarded(0, nullptr)));
  int32_t out = 0;
  thrown = 0;
  EXPECT_EQ(guarded(21, &out), TB_SUCCESS);
  EXPECT_EQ(out, 42);
  const std::pair<int, tb_status> cases[] = {
      {1, TB_ERROR_OUT_OF_MEMORY}, {2, TB_ERROR_DEVICE_FAILURE}, {3, TB_ERROR_UNKNOWN}, {4, TB_ERROR_UNKNOWN}};
  const char* sentences[] = {"out of host memory", "reading the device", "handle table corrupt", "non-standard"};
  for (int i = 0; i < 4; ++i) {
    thrown = cases[i].first;
    reported.clear();
    EXPECT_EQ(guarded(1, &out), cases[i].second) << "exception " << thrown;
    EXPECT_NE(reported.find(sentences[i]), std::string::npos) << reported;
  }
  thrown = 0;
}

}  // namespace
}  // namespace torchbridge::sdk

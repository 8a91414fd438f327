// The emulated device runtime (devices/emu), tested through dlopen exactly as TorchBridge loads a
// device library: the C table from tb_runtime_entry, no PyTorch and no emulator internals.
//
// Options are read once per loaded library, from the environment. CTest runs every test in its
// own process; to also allow running the binary directly (and to test several option values in
// one test), every load after the first in a process opens a fresh byte-identical copy of the
// library, which the dynamic loader treats as a new library with its own state.
#include <torchbridge/sdk/runtime.h>

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifndef TORCHBRIDGE_EMU_LIBRARY_PATH
#error "TORCHBRIDGE_EMU_LIBRARY_PATH must name the built libtorchbridge_device_emu.so"
#endif

// Under AddressSanitizer or ThreadSanitizer (scripts/sanitizers.sh) the sanitizer catches a fault
// itself: it reports "SEGV on unknown address" and exits non-zero instead of dying by the signal.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EXPECT_SEGV(statement) EXPECT_DEATH(statement, "SEGV")
#else
#define EXPECT_SEGV(statement) EXPECT_EXIT(statement, ::testing::KilledBySignal(SIGSEGV), "")
#endif
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

namespace {

using Clock = std::chrono::steady_clock;
using Options = std::vector<std::pair<const char*, const char*>>;
using Bytes = std::vector<unsigned char>;

constexpr const char* kOptionVariables[] = {"TORCHBRIDGE_EMU_DEVICES", "TORCHBRIDGE_EMU_MEMORY",
                                            "TORCHBRIDGE_EMU_GUARDED", "TORCHBRIDGE_EMU_LATENCY_US",
                                            "TORCHBRIDGE_EMU_FAULT"};

// ---- Loading ------------------------------------------------------------------------------------

std::vector<std::string>& library_copies() {
  static std::vector<std::string> copies;
  return copies;
}

// Copies stay on disk until exit: unlinking one early would let the next copy reuse its inode,
// and the loader identifies an already-loaded library by inode.
void remove_library_copies() {
  for (const std::string& path : library_copies()) std::filesystem::remove(path);
}

std::string fresh_library_path() {
  static bool first_load = true;
  if (first_load) {
    first_load = false;
    return TORCHBRIDGE_EMU_LIBRARY_PATH;
  }
  std::string path = (std::filesystem::temp_directory_path() / "torchbridge-emu-test-XXXXXX.so").string();
  const int fd = mkstemps(path.data(), 3);
  if (fd < 0) return TORCHBRIDGE_EMU_LIBRARY_PATH;
  close(fd);
  std::filesystem::copy_file(TORCHBRIDGE_EMU_LIBRARY_PATH, path, std::filesystem::copy_options::overwrite_existing);
  if (library_copies().empty()) std::atexit(remove_library_copies);
  library_copies().push_back(path);
  return path;
}

tb_runtime_entry_fn open_entry() {
  void* library = dlopen(fresh_library_path().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    ADD_FAILURE() << "dlopen failed: " << dlerror();
    return nullptr;
  }
  auto entry = reinterpret_cast<tb_runtime_entry_fn>(dlsym(library, TB_RUNTIME_ENTRY_SYMBOL));
  if (entry == nullptr) ADD_FAILURE() << "the library does not export " << TB_RUNTIME_ENTRY_SYMBOL;
  return entry;
}

// Sets exactly `options` (the other TORCHBRIDGE_EMU_* variables are unset) and loads.
tb_runtime_entry_fn prepare(const Options& options) {
  for (const char* name : kOptionVariables) unsetenv(name);
  for (const auto& [name, value] : options) setenv(name, value, 1);
  return open_entry();
}

struct LoadResult {
  const tb_runtime* runtime = nullptr;
  std::string error;
};

LoadResult load(const Options& options) {
  LoadResult result;
  tb_runtime_entry_fn entry = prepare(options);
  if (entry == nullptr) return result;
  const char* error = nullptr;
  result.runtime = entry(&error);
  if (result.runtime == nullptr) result.error = error == nullptr ? "<no error message>" : error;
  return result;
}

// The sentence a rejected option produces ("" if the options were accepted).
std::string rejection_of(const Options& options) {
  const LoadResult result = load(options);
  EXPECT_EQ(result.runtime, nullptr) << "the options were accepted";
  return result.error;
}

// ---- Test data ----------------------------------------------------------------------------------

Bytes pattern(std::size_t size, unsigned seed) {
  std::mt19937 generator(seed);
  Bytes bytes(size);
  for (auto& byte : bytes) byte = static_cast<unsigned char>(generator());
  return bytes;
}

// How runtime messages spell a pointer: lower-case hex.
std::string hex(const void* pointer) {
  std::ostringstream text;
  text << std::hex << reinterpret_cast<std::uintptr_t>(pointer);
  return text.str();
}

bool all_equal(const unsigned char* bytes, std::size_t size, unsigned char value) {
  return std::all_of(bytes, bytes + size, [value](unsigned char b) { return b == value; });
}

// ---- Fixture ------------------------------------------------------------------------------------

class EmuRuntimeTest : public ::testing::Test {
 protected:
  void start(const Options& options = {}) {
    const LoadResult result = load(options);
    ASSERT_NE(result.runtime, nullptr) << result.error;
    rt_ = result.runtime;
    ctx_ = rt_->context;
  }

  std::string last_error() const { return rt_->last_error_message(ctx_); }

  void* device_alloc(std::size_t bytes, int32_t device = 0) {
    void* pointer = nullptr;
    EXPECT_EQ(rt_->device_malloc(ctx_, device, bytes, &pointer), TB_SUCCESS) << last_error();
    return pointer;
  }
  void device_release(void* pointer, int32_t device = 0) {
    EXPECT_EQ(rt_->device_free(ctx_, device, pointer), TB_SUCCESS) << last_error();
  }
  unsigned char* host_alloc(std::size_t bytes) {
    void* pointer = nullptr;
    EXPECT_EQ(rt_->host_malloc(ctx_, bytes, &pointer), TB_SUCCESS) << last_error();
    return static_cast<unsigned char*>(pointer);
  }
  tb_stream new_stream(int32_t device = 0) {
    tb_stream stream = nullptr;
    EXPECT_EQ(rt_->stream_create(ctx_, device, 0, &stream), TB_SUCCESS) << last_error();
    return stream;
  }
  tb_event new_event(int32_t device = 0, bool timing = true) {
    tb_event event = nullptr;
    EXPECT_EQ(rt_->event_create(ctx_, device, timing ? 1 : 0, &event), TB_SUCCESS) << last_error();
    return event;
  }
  void write_device(void* device, const Bytes& bytes) {
    EXPECT_EQ(rt_->memcpy_sync(ctx_, device, bytes.data(), bytes.size(), TB_MEMCPY_HOST_TO_DEVICE), TB_SUCCESS)
        << last_error();
  }
  Bytes read_device(const void* device, std::size_t size) {
    Bytes bytes(size);
    EXPECT_EQ(rt_->memcpy_sync(ctx_, bytes.data(), device, size, TB_MEMCPY_DEVICE_TO_HOST), TB_SUCCESS)
        << last_error();
    return bytes;
  }
  tb_device_properties properties(int32_t device = 0) {
    tb_device_properties result{};
    EXPECT_EQ(rt_->device_properties(ctx_, device, &result), TB_SUCCESS) << last_error();
    return result;
  }
  uint64_t free_memory(int32_t device = 0) { return properties(device).free_memory_bytes; }

  const tb_runtime* rt_ = nullptr;
  void* ctx_ = nullptr;
};

#define EXPECT_OK(call) EXPECT_EQ((call), TB_SUCCESS) << last_error()
#define ASSERT_OK(call) ASSERT_EQ((call), TB_SUCCESS) << last_error()

// One fixture, several suite names, so `ctest -R EmuRuntime` selects all and the names group them.
using EmuRuntimeOptions = EmuRuntimeTest;
using EmuRuntimeDevices = EmuRuntimeTest;
using EmuRuntimeMemory = EmuRuntimeTest;
using EmuRuntimeCopies = EmuRuntimeTest;
using EmuRuntimeStreams = EmuRuntimeTest;
using EmuRuntimeEvents = EmuRuntimeTest;
using EmuRuntimeGuard = EmuRuntimeTest;
using EmuRuntimeFaults = EmuRuntimeTest;
using EmuRuntimeConcurrency = EmuRuntimeTest;

constexpr uint64_t kMiB = 1024 * 1024;

// ---- Options ------------------------------------------------------------------------------------

TEST_F(EmuRuntimeOptions, DefaultsAreTwoGuardedDevicesOfOneGiB) {
  ASSERT_NO_FATAL_FAILURE(start());
  EXPECT_EQ(rt_->struct_size, sizeof(tb_runtime));
  EXPECT_EQ(rt_->abi_version, TB_RUNTIME_ABI_VERSION);
  EXPECT_STREQ(rt_->name, "emu");
  int32_t count = 0;
  EXPECT_OK(rt_->device_count(ctx_, &count));
  EXPECT_EQ(count, 2);
  EXPECT_EQ(properties(0).total_memory_bytes, 1024 * kMiB);
  EXPECT_EQ(properties(1).total_memory_bytes, 1024 * kMiB);
  EXPECT_EQ(properties(0).host_addressable, 0);
}

TEST_F(EmuRuntimeOptions, DeviceCountAndCapacitySuffixesAreHonoured) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_DEVICES", "5"}, {"TORCHBRIDGE_EMU_MEMORY", "3MiB"}}));
  int32_t count = 0;
  EXPECT_OK(rt_->device_count(ctx_, &count));
  EXPECT_EQ(count, 5);
  EXPECT_EQ(properties(4).total_memory_bytes, 3 * kMiB);

  const std::vector<std::pair<const char*, uint64_t>> capacities = {
      {"4096", 4096},   {"4K", 4096},          {"4k", 4096},         {"4KiB", 4096},
      {"2M", 2 * kMiB}, {"2MiB", 2 * kMiB},    {"1G", 1024 * kMiB},  {"1GiB", 1024 * kMiB},
      {" 64K ", 65536}, {"1000", 1000}};
  for (const auto& [text, bytes] : capacities) {
    const LoadResult result = load({{"TORCHBRIDGE_EMU_MEMORY", text}, {"TORCHBRIDGE_EMU_DEVICES", "1"}});
    ASSERT_NE(result.runtime, nullptr) << text << ": " << result.error;
    tb_device_properties props{};
    EXPECT_EQ(result.runtime->device_properties(result.runtime->context, 0, &props), TB_SUCCESS);
    EXPECT_EQ(props.total_memory_bytes, bytes) << text;
    EXPECT_EQ(props.free_memory_bytes, bytes) << text;
  }
}

TEST_F(EmuRuntimeOptions, RejectsDeviceCountsOutsideOneTo64) {
  for (const char* value : {"0", "65", "-1", "two", "2x"}) {
    const std::string error = rejection_of({{"TORCHBRIDGE_EMU_DEVICES", value}});
    EXPECT_NE(error.find("TORCHBRIDGE_EMU_DEVICES"), std::string::npos) << error;
    EXPECT_NE(error.find(std::string("'") + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("from 1 to 64"), std::string::npos) << error;
  }
  EXPECT_NE(load({{"TORCHBRIDGE_EMU_DEVICES", "64"}, {"TORCHBRIDGE_EMU_MEMORY", "1M"}}).runtime, nullptr);
}

TEST_F(EmuRuntimeOptions, RejectsCapacityOfZero) {
  for (const char* value : {"0", "0G", "0KiB"}) {
    const std::string error = rejection_of({{"TORCHBRIDGE_EMU_MEMORY", value}});
    EXPECT_NE(error.find("TORCHBRIDGE_EMU_MEMORY"), std::string::npos) << error;
    EXPECT_NE(error.find(std::string("'") + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("capacity of zero"), std::string::npos) << error;
  }
}

TEST_F(EmuRuntimeOptions, RejectsMalformedCapacities) {
  for (const char* value : {"12Q", "-5", "abc", "1.5G", "G", "5 M", "99999999999999999999999"}) {
    const std::string error = rejection_of({{"TORCHBRIDGE_EMU_MEMORY", value}});
    EXPECT_NE(error.find(std::string("TORCHBRIDGE_EMU_MEMORY='") + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("K, M, G, KiB, MiB or GiB"), std::string::npos) << error;
  }
  const std::string too_large = rejection_of({{"TORCHBRIDGE_EMU_MEMORY", "2048G"}});
  EXPECT_NE(too_large.find("too large"), std::string::npos) << too_large;
}

TEST_F(EmuRuntimeOptions, RejectsUnknownFault) {
  const std::string error = rejection_of({{"TORCHBRIDGE_EMU_FAULT", "bogus"}});
  EXPECT_NE(error.find("TORCHBRIDGE_EMU_FAULT='bogus'"), std::string::npos) << error;
  EXPECT_NE(error.find("none, drop-copy, corrupt-copy, leak"), std::string::npos) << error;
}

TEST_F(EmuRuntimeOptions, RejectsBadGuardedAndLatencyValues) {
  std::string error = rejection_of({{"TORCHBRIDGE_EMU_GUARDED", "yes"}});
  EXPECT_NE(error.find("TORCHBRIDGE_EMU_GUARDED='yes'"), std::string::npos) << error;
  EXPECT_NE(error.find("expected 1"), std::string::npos) << error;
  for (const char* value : {"-1", "fast", "10000001"}) {
    error = rejection_of({{"TORCHBRIDGE_EMU_LATENCY_US", value}});
    EXPECT_NE(error.find(std::string("TORCHBRIDGE_EMU_LATENCY_US='") + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("microseconds"), std::string::npos) << error;
  }
}

TEST_F(EmuRuntimeOptions, EmptyValuesMeanDefaults) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_DEVICES", ""}, {"TORCHBRIDGE_EMU_MEMORY", ""},
                                 {"TORCHBRIDGE_EMU_FAULT", ""}}));
  int32_t count = 0;
  EXPECT_OK(rt_->device_count(ctx_, &count));
  EXPECT_EQ(count, 2);
  EXPECT_EQ(properties().total_memory_bytes, 1024 * kMiB);
}

TEST_F(EmuRuntimeOptions, EntryAnswersTheSameOnEveryCall) {
  tb_runtime_entry_fn entry = prepare({{"TORCHBRIDGE_EMU_DEVICES", "0"}});
  ASSERT_NE(entry, nullptr);
  const char* first = nullptr;
  const char* second = nullptr;
  EXPECT_EQ(entry(&first), nullptr);
  setenv("TORCHBRIDGE_EMU_DEVICES", "1", 1);  // read once: a later change has no effect
  EXPECT_EQ(entry(&second), nullptr);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first, second);  // long-lived, not rebuilt
  EXPECT_NE(std::string(first).find("TORCHBRIDGE_EMU_DEVICES='0'"), std::string::npos) << first;
  EXPECT_EQ(entry(nullptr), nullptr);  // a NULL error_message is tolerated
}

// ---- Devices ------------------------------------------------------------------------------------

TEST_F(EmuRuntimeDevices, PropertiesDescribeTheEmulator) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "64M"}}));
  const tb_device_properties props = properties(1);
  EXPECT_STREQ(props.name, "TorchBridge emulated accelerator");
  EXPECT_STREQ(props.vendor, "TorchBridge");
  EXPECT_STREQ(props.architecture, "emu-guarded");
  EXPECT_STREQ(props.driver_version, "0.1.0");
  EXPECT_EQ(props.total_memory_bytes, 64 * kMiB);
  EXPECT_EQ(props.free_memory_bytes, 64 * kMiB);
  EXPECT_EQ(props.multiprocessor_count, 0);
  EXPECT_EQ(props.host_addressable, 0);
  EXPECT_EQ(props.is_real_hardware, 0);
}

TEST_F(EmuRuntimeDevices, CurrentDeviceIsPerThread) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  int32_t device = -1;
  EXPECT_OK(rt_->get_device(ctx_, &device));
  EXPECT_EQ(device, 0);
  EXPECT_OK(rt_->set_device(ctx_, 1));
  EXPECT_OK(rt_->get_device(ctx_, &device));
  EXPECT_EQ(device, 1);

  int32_t seen_by_other_thread = -1;
  std::thread other([&] {
    rt_->get_device(ctx_, &seen_by_other_thread);
    rt_->set_device(ctx_, 0);
  });
  other.join();
  EXPECT_EQ(seen_by_other_thread, 0);
  EXPECT_OK(rt_->get_device(ctx_, &device));
  EXPECT_EQ(device, 1);  // the other thread's set_device did not leak here
}

TEST_F(EmuRuntimeDevices, InvalidIndicesAreRejectedEverywhere) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  EXPECT_EQ(rt_->set_device(ctx_, 2), TB_ERROR_INVALID_DEVICE);
  EXPECT_NE(last_error().find("device 2"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("(0..1)"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->set_device(ctx_, -1), TB_ERROR_INVALID_DEVICE);
  int32_t device = -1;
  EXPECT_OK(rt_->get_device(ctx_, &device));
  EXPECT_EQ(device, 0);  // unchanged by the failed calls

  tb_device_properties props{};
  void* pointer = nullptr;
  tb_stream stream = nullptr;
  tb_event event = nullptr;
  EXPECT_EQ(rt_->device_properties(ctx_, 2, &props), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->device_synchronize(ctx_, 7), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->device_malloc(ctx_, 2, 256, &pointer), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->device_free(ctx_, -3, nullptr), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->stream_create(ctx_, 2, 0, &stream), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->event_create(ctx_, -1, 1, &event), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(pointer, nullptr);
  EXPECT_EQ(stream, nullptr);
  EXPECT_EQ(event, nullptr);
}

TEST_F(EmuRuntimeDevices, StatusStringsAndLastErrorMessages) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  std::vector<std::string> names;
  for (tb_status status : {TB_SUCCESS, TB_ERROR_INVALID_VALUE, TB_ERROR_INVALID_DEVICE, TB_ERROR_OUT_OF_MEMORY,
                           TB_ERROR_INVALID_POINTER, TB_ERROR_NOT_READY, TB_ERROR_INVALID_HANDLE,
                           TB_ERROR_NOT_SUPPORTED, TB_ERROR_DEVICE_FAILURE, TB_ERROR_UNKNOWN}) {
    const char* name = rt_->status_string(ctx_, status);
    ASSERT_NE(name, nullptr);
    EXPECT_GT(std::strlen(name), 0u);
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end()) << "two statuses share a description";
  EXPECT_NE(rt_->status_string(ctx_, static_cast<tb_status>(12345)), nullptr);

  EXPECT_STREQ(rt_->last_error_message(ctx_), "");
  EXPECT_EQ(rt_->set_device(ctx_, 9), TB_ERROR_INVALID_DEVICE);
  const std::string failure = last_error();
  EXPECT_NE(failure.find("device 9"), std::string::npos) << failure;
  std::string other_thread_message = "<unset>";
  std::thread other([&] { other_thread_message = rt_->last_error_message(ctx_); });
  other.join();
  EXPECT_EQ(other_thread_message, "");      // per thread
  int32_t count = 0;
  EXPECT_OK(rt_->device_count(ctx_, &count));
  EXPECT_EQ(last_error(), failure);         // a success does not erase the last failure
}

// ---- Memory -------------------------------------------------------------------------------------

TEST_F(EmuRuntimeMemory, FreeMemoryAccountingIsExact) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  EXPECT_EQ(free_memory(0), kMiB);
  void* a = device_alloc(4096);
  EXPECT_EQ(free_memory(0), kMiB - 4096);
  void* b = device_alloc(1000);  // rounded up to the 256-byte granule
  EXPECT_EQ(free_memory(0), kMiB - 4096 - 1024);
  void* c = device_alloc(300, 1);
  EXPECT_EQ(free_memory(1), kMiB - 512);
  EXPECT_EQ(free_memory(0), kMiB - 4096 - 1024);
  for (void* pointer : {a, b, c}) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pointer) % 256, 0u);
  EXPECT_NE(a, b);
  device_release(a);
  EXPECT_EQ(free_memory(0), kMiB - 1024);
  device_release(b);
  device_release(c, 1);
  EXPECT_EQ(free_memory(0), kMiB);
  EXPECT_EQ(free_memory(1), kMiB);
}

TEST_F(EmuRuntimeMemory, ZeroBytesAndNullPointers) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  void* pointer = reinterpret_cast<void*>(0x1);
  EXPECT_OK(rt_->device_malloc(ctx_, 0, 0, &pointer));
  EXPECT_EQ(pointer, nullptr);
  EXPECT_OK(rt_->device_free(ctx_, 0, nullptr));
  EXPECT_EQ(free_memory(0), kMiB);
  EXPECT_EQ(rt_->device_malloc(ctx_, 0, 256, nullptr), TB_ERROR_INVALID_VALUE);
}

TEST_F(EmuRuntimeMemory, OutOfMemoryNamesRequestedAndFreeBytes) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  void* pointer = nullptr;
  EXPECT_EQ(rt_->device_malloc(ctx_, 0, 2 * kMiB, &pointer), TB_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(pointer, nullptr);
  EXPECT_NE(last_error().find("out of memory on emu device 0: requested 2097152 bytes, 1048576 bytes free of 1048576"),
            std::string::npos)
      << last_error();

  void* big = device_alloc(768 * 1024, 1);
  EXPECT_EQ(rt_->device_malloc(ctx_, 1, 512 * 1024, &pointer), TB_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(last_error().find("emu device 1: requested 524288 bytes, 262144 bytes free of 1048576"),
            std::string::npos)
      << last_error();
  // Exactly the remaining capacity still fits: the limit is real, not approximate.
  void* rest = device_alloc(256 * 1024, 1);
  EXPECT_NE(rest, nullptr);
  EXPECT_EQ(free_memory(1), 0u);
  EXPECT_EQ(rt_->device_malloc(ctx_, 1, 1, &pointer), TB_ERROR_OUT_OF_MEMORY);
  device_release(big, 1);
  device_release(rest, 1);
  EXPECT_NE(device_alloc(kMiB, 1), nullptr);
}

TEST_F(EmuRuntimeMemory, FreedNeighboursCoalesce) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "4K"}, {"TORCHBRIDGE_EMU_DEVICES", "1"}}));
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(device_alloc(256));
  void* pointer = nullptr;
  EXPECT_EQ(rt_->device_malloc(ctx_, 0, 256, &pointer), TB_ERROR_OUT_OF_MEMORY);
  for (int i = 0; i < 16; i += 2) device_release(blocks[i]);
  EXPECT_EQ(free_memory(), 2048u);
  // 2 KiB are free, but only in 256-byte holes.
  EXPECT_EQ(rt_->device_malloc(ctx_, 0, 512, &pointer), TB_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(last_error().find("2048 bytes free of 4096 (largest free block 256 bytes"), std::string::npos)
      << last_error();
  for (int i = 1; i < 16; i += 2) device_release(blocks[i]);
  void* whole = device_alloc(4096);  // only possible if every hole merged back into one range
  EXPECT_EQ(whole, blocks[0]);
}

TEST_F(EmuRuntimeMemory, InvalidAndDoubleFreesAreReportedNotExecuted) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  void* a = device_alloc(1024);
  void* b = device_alloc(1024);
  const Bytes data = pattern(1024, 7);
  write_device(b, data);

  int on_the_stack = 0;
  EXPECT_EQ(rt_->device_free(ctx_, 0, &on_the_stack), TB_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find(hex(&on_the_stack)), std::string::npos) << last_error();

  void* inside = static_cast<char*>(a) + 256;
  EXPECT_EQ(rt_->device_free(ctx_, 0, inside), TB_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find(hex(inside)), std::string::npos) << last_error();

  EXPECT_EQ(rt_->device_free(ctx_, 1, a), TB_ERROR_INVALID_POINTER);  // wrong device
  EXPECT_NE(last_error().find("emu device 0"), std::string::npos) << last_error();

  EXPECT_EQ(free_memory(), kMiB - 2048);  // none of the above freed anything
  device_release(a);
  EXPECT_EQ(rt_->device_free(ctx_, 0, a), TB_ERROR_INVALID_POINTER);  // double free
  EXPECT_NE(last_error().find(hex(a)), std::string::npos) << last_error();
  EXPECT_EQ(free_memory(), kMiB - 1024);
  EXPECT_EQ(read_device(b, 1024), data);  // the neighbour is intact
}

TEST_F(EmuRuntimeMemory, HostMemoryIsPageAlignedAndTracked) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  unsigned char* host = host_alloc(100);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(host) % static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE)), 0u);
  std::memset(host, 0x5A, 100);  // ordinary, writable host memory
  void* zero = reinterpret_cast<void*>(0x1);
  EXPECT_OK(rt_->host_malloc(ctx_, 0, &zero));
  EXPECT_EQ(zero, nullptr);

  std::vector<char> foreign(64);
  EXPECT_EQ(rt_->host_free(ctx_, foreign.data()), TB_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find(hex(foreign.data())), std::string::npos) << last_error();
  EXPECT_EQ(rt_->host_free(ctx_, host + 1), TB_ERROR_INVALID_POINTER);
  EXPECT_OK(rt_->host_free(ctx_, host));
  EXPECT_EQ(rt_->host_free(ctx_, host), TB_ERROR_INVALID_POINTER);
  EXPECT_OK(rt_->host_free(ctx_, nullptr));
}

// ---- Copies -------------------------------------------------------------------------------------

TEST_F(EmuRuntimeCopies, EveryKindRoundTripsBitExactly) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "16M"}}));
  const std::size_t size = kMiB + 3;  // not a multiple of anything convenient
  const Bytes data = pattern(size, 1);
  void* on_0 = device_alloc(size, 0);
  void* also_on_0 = device_alloc(size, 0);
  void* on_1 = device_alloc(size, 1);

  // Synchronous: host -> 0 -> 0 -> 1 -> host.
  EXPECT_OK(rt_->memcpy_sync(ctx_, on_0, data.data(), size, TB_MEMCPY_HOST_TO_DEVICE));
  EXPECT_OK(rt_->memcpy_sync(ctx_, also_on_0, on_0, size, TB_MEMCPY_DEVICE_TO_DEVICE));
  EXPECT_OK(rt_->memcpy_sync(ctx_, on_1, also_on_0, size, TB_MEMCPY_DEVICE_TO_DEVICE));
  Bytes back(size);
  EXPECT_OK(rt_->memcpy_sync(ctx_, back.data(), on_1, size, TB_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(back, data);

  // Asynchronous, the other way round, on a stream of device 1.
  const Bytes other = pattern(size, 2);
  tb_stream stream = new_stream(1);
  unsigned char* pinned = host_alloc(size);
  std::memcpy(pinned, other.data(), size);
  EXPECT_OK(rt_->memcpy_async(ctx_, on_1, pinned, size, TB_MEMCPY_HOST_TO_DEVICE, stream));
  EXPECT_OK(rt_->memcpy_async(ctx_, on_0, on_1, size, TB_MEMCPY_DEVICE_TO_DEVICE, stream));
  EXPECT_OK(rt_->memcpy_async(ctx_, also_on_0, on_0, size, TB_MEMCPY_DEVICE_TO_DEVICE, stream));
  Bytes async_back(size);
  EXPECT_OK(rt_->memcpy_async(ctx_, async_back.data(), also_on_0, size, TB_MEMCPY_DEVICE_TO_HOST, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  EXPECT_EQ(async_back, other);
  EXPECT_OK(rt_->stream_destroy(ctx_, stream));
  EXPECT_OK(rt_->host_free(ctx_, pinned));
}

TEST_F(EmuRuntimeCopies, OffsetsAndOverlappingDeviceCopies) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  Bytes expected = pattern(1000, 3);
  unsigned char* device = static_cast<unsigned char*>(device_alloc(1000));
  write_device(device, expected);
  const Bytes middle = pattern(50, 4);
  EXPECT_OK(rt_->memcpy_sync(ctx_, device + 100, middle.data(), 50, TB_MEMCPY_HOST_TO_DEVICE));
  std::copy(middle.begin(), middle.end(), expected.begin() + 100);
  EXPECT_EQ(read_device(device, 1000), expected);
  EXPECT_EQ(read_device(device + 990, 10), Bytes(expected.begin() + 990, expected.end()));  // up to the last byte

  // Shift 500 bytes forward by 10 inside one allocation: must behave like memmove.
  EXPECT_OK(rt_->memcpy_sync(ctx_, device + 10, device, 500, TB_MEMCPY_DEVICE_TO_DEVICE));
  std::memmove(expected.data() + 10, expected.data(), 500);
  EXPECT_EQ(read_device(device, 1000), expected);
}

TEST_F(EmuRuntimeCopies, RangesOutsideLiveAllocationsAreRejected) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  unsigned char* device = static_cast<unsigned char*>(device_alloc(1000));
  const Bytes data = pattern(2048, 5);
  write_device(device, Bytes(data.begin(), data.begin() + 1000));
  tb_stream stream = new_stream();

  // One byte past the requested size (still inside the 1024-byte granule) is already outside.
  EXPECT_EQ(rt_->memcpy_sync(ctx_, device, data.data(), 1001, TB_MEMCPY_HOST_TO_DEVICE), TB_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find(hex(device)), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("1001 bytes"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->memcpy_async(ctx_, device + 999, data.data(), 2, TB_MEMCPY_HOST_TO_DEVICE, stream),
            TB_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find(hex(device + 999)), std::string::npos) << last_error();
  Bytes host(64);
  EXPECT_EQ(rt_->memcpy_sync(ctx_, host.data(), data.data(), 64, TB_MEMCPY_DEVICE_TO_HOST), TB_ERROR_INVALID_POINTER);
  EXPECT_EQ(rt_->memset_async(ctx_, device + 1000, 0, 1, stream), TB_ERROR_INVALID_POINTER);
  EXPECT_EQ(rt_->memcpy_sync(ctx_, nullptr, device, 16, TB_MEMCPY_DEVICE_TO_DEVICE), TB_ERROR_INVALID_POINTER);

  // Device memory passed where the kind says host, and kinds that do not exist.
  void* other = device_alloc(1000);
  EXPECT_EQ(rt_->memcpy_sync(ctx_, other, device, 16, TB_MEMCPY_HOST_TO_DEVICE), TB_ERROR_INVALID_VALUE);
  EXPECT_EQ(rt_->memcpy_sync(ctx_, device, data.data(), 16, static_cast<tb_memcpy_kind>(7)), TB_ERROR_INVALID_VALUE);
  EXPECT_EQ(rt_->memcpy_sync(ctx_, host.data(), nullptr, 16, TB_MEMCPY_HOST_TO_DEVICE), TB_ERROR_INVALID_POINTER);
  EXPECT_EQ(rt_->memcpy_sync(ctx_, device, nullptr, 16, TB_MEMCPY_HOST_TO_DEVICE), TB_ERROR_INVALID_VALUE);

  // Freed memory is no longer a valid target, checked when the copy is queued.
  device_release(other);
  EXPECT_EQ(rt_->memcpy_async(ctx_, other, data.data(), 16, TB_MEMCPY_HOST_TO_DEVICE, stream),
            TB_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find(hex(other)), std::string::npos) << last_error();

  // Zero-byte copies move nothing and need no valid pointers.
  EXPECT_OK(rt_->memcpy_sync(ctx_, nullptr, nullptr, 0, TB_MEMCPY_DEVICE_TO_DEVICE));
  EXPECT_OK(rt_->memcpy_async(ctx_, nullptr, nullptr, 0, TB_MEMCPY_HOST_TO_DEVICE, stream));

  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  EXPECT_EQ(read_device(device, 1000), Bytes(data.begin(), data.begin() + 1000));  // nothing was written
}

TEST_F(EmuRuntimeCopies, MemsetFillsTheLowByteOfTheValue) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  unsigned char* device = static_cast<unsigned char*>(device_alloc(4096));
  tb_stream stream = new_stream();
  EXPECT_OK(rt_->memset_async(ctx_, device, 0x1CD, 4096, stream));  // only 0xCD counts
  EXPECT_OK(rt_->memset_async(ctx_, device + 1000, 0xAB, 96, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  const Bytes bytes = read_device(device, 4096);
  EXPECT_TRUE(all_equal(bytes.data(), 1000, 0xCD));
  EXPECT_TRUE(all_equal(bytes.data() + 1000, 96, 0xAB));
  EXPECT_TRUE(all_equal(bytes.data() + 1096, 4096 - 1096, 0xCD));
}

// ---- Streams ------------------------------------------------------------------------------------

TEST_F(EmuRuntimeStreams, OperationsOnOneStreamRunInOrder) {
  // Latency widens every window in which a reordering bug could show.
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "200"}}));
  constexpr int kRounds = 64;
  constexpr std::size_t kSize = 512;
  void* device = device_alloc(kSize);
  void* copy = device_alloc(kSize);
  tb_stream stream = new_stream();
  std::vector<Bytes> snapshots(kRounds, Bytes(kSize));
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_OK(rt_->memset_async(ctx_, device, round, kSize, stream));
    EXPECT_OK(rt_->memcpy_async(ctx_, copy, device, kSize, TB_MEMCPY_DEVICE_TO_DEVICE, stream));
    EXPECT_OK(rt_->memcpy_async(ctx_, snapshots[round].data(), copy, kSize, TB_MEMCPY_DEVICE_TO_HOST, stream));
  }
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_TRUE(all_equal(snapshots[round].data(), kSize, static_cast<unsigned char>(round))) << "round " << round;
  }
}

TEST_F(EmuRuntimeStreams, LatencyMakesAMissingSynchronizeVisible) {
  if (kThreadSanitizer) {
    GTEST_SKIP() << "its early reads race with the copy on purpose (a caller that forgot to synchronize); "
                    "ThreadSanitizer rightly reports them";
  }
  constexpr auto kLatency = std::chrono::milliseconds(200);
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "200000"}}));
  constexpr std::size_t kSize = 4096;
  const Bytes old_data = pattern(kSize, 10);
  const Bytes new_data = pattern(kSize, 11);
  void* device = device_alloc(kSize);
  tb_stream stream = new_stream();
  unsigned char* host = host_alloc(kSize);

  // The worker sleeps kLatency *after* the call queued the copy, so whatever this thread observes
  // before enqueued + kLatency predates the copy. Only such observations are judged, which makes
  // the test deterministic; a machine too busy to observe in time retries. The early reads are
  // deliberately unsynchronised, exactly like a caller that forgot to synchronize (ThreadSanitizer
  // reports them as races, which is the point).
  int judged = 0;
  for (int attempt = 0; attempt < 5 && judged == 0; ++attempt) {
    write_device(device, old_data);
    std::memset(host, 0, kSize);

    Clock::time_point enqueued = Clock::now();
    ASSERT_OK(rt_->memcpy_async(ctx_, host, device, kSize, TB_MEMCPY_DEVICE_TO_HOST, stream));
    const bool host_untouched = all_equal(host, kSize, 0);
    const tb_status busy = rt_->stream_query(ctx_, stream);
    const bool in_time = Clock::now() - enqueued < kLatency;
    ASSERT_OK(rt_->stream_synchronize(ctx_, stream));
    EXPECT_GE(Clock::now() - enqueued, kLatency);  // the copy really was held back by the latency
    EXPECT_EQ(rt_->stream_query(ctx_, stream), TB_SUCCESS);
    EXPECT_EQ(Bytes(host, host + kSize), old_data);  // after synchronize it is there
    if (!in_time) continue;

    // Host to device: memcpy_sync does not wait for the queued copy either (runtime.h).
    std::memcpy(host, new_data.data(), kSize);
    enqueued = Clock::now();
    ASSERT_OK(rt_->memcpy_async(ctx_, device, host, kSize, TB_MEMCPY_HOST_TO_DEVICE, stream));
    const Bytes early_read = read_device(device, kSize);
    const bool in_time_again = Clock::now() - enqueued < kLatency;
    ASSERT_OK(rt_->stream_synchronize(ctx_, stream));
    EXPECT_EQ(read_device(device, kSize), new_data);
    if (!in_time_again) continue;

    ++judged;
    EXPECT_TRUE(host_untouched) << "device-to-host data arrived before the stream ran";
    EXPECT_EQ(busy, TB_ERROR_NOT_READY);
    EXPECT_EQ(early_read, old_data) << "host-to-device data arrived before the stream ran";
  }
  EXPECT_EQ(judged, 1) << "the machine never let this thread observe within " << kLatency.count() << " ms";
}

TEST_F(EmuRuntimeStreams, DestroyRunsQueuedWorkThenInvalidatesTheHandle) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "20000"}}));
  void* device = device_alloc(256);
  tb_stream stream = new_stream();
  EXPECT_EQ(rt_->stream_query(ctx_, stream), TB_SUCCESS);  // new and idle
  Bytes host(256);
  EXPECT_OK(rt_->memset_async(ctx_, device, 0x42, 256, stream));
  EXPECT_OK(rt_->memcpy_async(ctx_, host.data(), device, 256, TB_MEMCPY_DEVICE_TO_HOST, stream));
  EXPECT_OK(rt_->stream_destroy(ctx_, stream));
  EXPECT_TRUE(all_equal(host.data(), 256, 0x42));

  EXPECT_EQ(rt_->stream_query(ctx_, stream), TB_ERROR_INVALID_HANDLE);
  EXPECT_NE(last_error().find("not a live stream"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->stream_synchronize(ctx_, stream), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->memset_async(ctx_, device, 0, 256, stream), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->stream_destroy(ctx_, stream), TB_ERROR_INVALID_HANDLE);

  // A new stream never reuses the old handle.
  tb_stream next = new_stream();
  EXPECT_NE(next, stream);
  EXPECT_EQ(rt_->stream_query(ctx_, stream), TB_ERROR_INVALID_HANDLE);
}

TEST_F(EmuRuntimeStreams, UnknownHandlesAreRejected) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  tb_event event = new_event();
  const auto made_up = reinterpret_cast<tb_stream>(std::uintptr_t{0xdeadbeef});
  EXPECT_EQ(rt_->stream_query(ctx_, made_up), TB_ERROR_INVALID_HANDLE);
  EXPECT_NE(last_error().find("deadbeef"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->stream_query(ctx_, reinterpret_cast<tb_stream>(event)), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->stream_synchronize(ctx_, nullptr), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->event_query(ctx_, reinterpret_cast<tb_event>(made_up)), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->event_destroy(ctx_, nullptr), TB_ERROR_INVALID_HANDLE);
  tb_stream stream = new_stream();
  EXPECT_EQ(rt_->event_query(ctx_, reinterpret_cast<tb_event>(stream)), TB_ERROR_INVALID_HANDLE);
  EXPECT_OK(rt_->event_destroy(ctx_, event));
  EXPECT_EQ(rt_->stream_wait_event(ctx_, stream, event), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->event_record(ctx_, event, stream), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->event_destroy(ctx_, event), TB_ERROR_INVALID_HANDLE);
}

TEST_F(EmuRuntimeStreams, DeviceSynchronizeWaitsForEveryStreamOfTheDevice) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "30000"}}));
  void* a = device_alloc(256);
  void* b = device_alloc(256);
  tb_stream first = new_stream();
  tb_stream second = new_stream();
  Bytes host_a(256), host_b(256);
  EXPECT_OK(rt_->memset_async(ctx_, a, 1, 256, first));
  EXPECT_OK(rt_->memcpy_async(ctx_, host_a.data(), a, 256, TB_MEMCPY_DEVICE_TO_HOST, first));
  EXPECT_OK(rt_->memset_async(ctx_, b, 2, 256, second));
  EXPECT_OK(rt_->memset_async(ctx_, b, 3, 256, second));
  EXPECT_OK(rt_->memcpy_async(ctx_, host_b.data(), b, 256, TB_MEMCPY_DEVICE_TO_HOST, second));
  EXPECT_OK(rt_->device_synchronize(ctx_, 0));
  EXPECT_TRUE(all_equal(host_a.data(), 256, 1));
  EXPECT_TRUE(all_equal(host_b.data(), 256, 3));
  EXPECT_EQ(rt_->stream_query(ctx_, first), TB_SUCCESS);
  EXPECT_EQ(rt_->stream_query(ctx_, second), TB_SUCCESS);
}

TEST_F(EmuRuntimeStreams, WaitEventJoinsTwoStreams) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "16M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "30000"}}));
  constexpr std::size_t kSize = kMiB;
  const Bytes data = pattern(kSize, 20);
  void* produced = device_alloc(kSize, 0);
  void* consumed = device_alloc(kSize, 1);
  tb_stream producer = new_stream(0);
  tb_stream consumer = new_stream(1);
  tb_event ready = new_event(0, false);

  // Producer: three latency-delayed steps; consumer: one step, so without the wait it would copy
  // the buffer long before the producer's data is in it.
  EXPECT_OK(rt_->memset_async(ctx_, produced, 0, kSize, producer));
  EXPECT_OK(rt_->memset_async(ctx_, produced, 0xEE, kSize, producer));
  EXPECT_OK(rt_->memcpy_async(ctx_, produced, data.data(), kSize, TB_MEMCPY_HOST_TO_DEVICE, producer));
  EXPECT_OK(rt_->event_record(ctx_, ready, producer));
  EXPECT_OK(rt_->stream_wait_event(ctx_, consumer, ready));
  EXPECT_OK(rt_->memcpy_async(ctx_, consumed, produced, kSize, TB_MEMCPY_DEVICE_TO_DEVICE, consumer));
  Bytes result(kSize);
  EXPECT_OK(rt_->memcpy_async(ctx_, result.data(), consumed, kSize, TB_MEMCPY_DEVICE_TO_HOST, consumer));

  EXPECT_OK(rt_->stream_synchronize(ctx_, consumer));  // the consumer only
  EXPECT_EQ(result, data);
  EXPECT_EQ(rt_->event_query(ctx_, ready), TB_SUCCESS);  // the consumer could only finish after it

  // Waiting on an event that was never recorded waits for nothing.
  tb_event never = new_event(1);
  EXPECT_OK(rt_->stream_wait_event(ctx_, consumer, never));
  EXPECT_OK(rt_->stream_synchronize(ctx_, consumer));
}

TEST_F(EmuRuntimeStreams, PriorityIsAccepted) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  for (int32_t priority : {-5, 0, 3}) {
    tb_stream stream = nullptr;
    EXPECT_OK(rt_->stream_create(ctx_, 1, priority, &stream));
    EXPECT_OK(rt_->stream_destroy(ctx_, stream));
  }
  EXPECT_EQ(rt_->stream_create(ctx_, 0, 0, nullptr), TB_ERROR_INVALID_VALUE);
}

// ---- Events -------------------------------------------------------------------------------------

TEST_F(EmuRuntimeEvents, CompletesWhenTheStreamReachesTheRecord) {
  constexpr auto kLatency = std::chrono::milliseconds(200);
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "200000"}}));
  tb_stream stream = new_stream();
  tb_event event = new_event();
  EXPECT_EQ(rt_->event_query(ctx_, event), TB_SUCCESS);  // never recorded
  EXPECT_OK(rt_->event_synchronize(ctx_, event));        // returns at once

  int judged = 0;
  for (int attempt = 0; attempt < 5 && judged == 0; ++attempt) {
    const Clock::time_point recorded = Clock::now();
    ASSERT_OK(rt_->event_record(ctx_, event, stream));
    const tb_status early = rt_->event_query(ctx_, event);
    const bool in_time = Clock::now() - recorded < kLatency;
    EXPECT_OK(rt_->event_synchronize(ctx_, event));
    EXPECT_GE(Clock::now() - recorded, kLatency);  // synchronize really waited for the worker
    EXPECT_EQ(rt_->event_query(ctx_, event), TB_SUCCESS);
    if (!in_time) continue;
    ++judged;
    EXPECT_EQ(early, TB_ERROR_NOT_READY);
  }
  EXPECT_EQ(judged, 1) << "the machine never let this thread observe within " << kLatency.count() << " ms";
}

TEST_F(EmuRuntimeEvents, ElapsedTimeCoversTheInjectedLatency) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "20000"}}));
  void* device = device_alloc(1024);
  tb_stream stream = new_stream();
  tb_event start_event = new_event();
  tb_event end_event = new_event();
  const Clock::time_point before = Clock::now();
  EXPECT_OK(rt_->event_record(ctx_, start_event, stream));
  EXPECT_OK(rt_->memset_async(ctx_, device, 0, 1024, stream));
  EXPECT_OK(rt_->event_record(ctx_, end_event, stream));
  EXPECT_OK(rt_->event_synchronize(ctx_, end_event));
  const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - before).count();

  float elapsed = -1;
  EXPECT_OK(rt_->event_elapsed_time(ctx_, start_event, end_event, &elapsed));
  // Between the two timestamps lie the memset's and the end marker's latency sleeps: >= 40 ms.
  EXPECT_GE(elapsed, 40.0f - 0.01f);
  EXPECT_LE(elapsed, wall_ms);  // and no more than this thread measured around the whole thing
  float reversed = 0;
  EXPECT_OK(rt_->event_elapsed_time(ctx_, end_event, start_event, &reversed));
  EXPECT_FLOAT_EQ(reversed, -elapsed);
}

TEST_F(EmuRuntimeEvents, ElapsedTimeNeedsTwoCompletedTimingEvents) {
  constexpr auto kLatency = std::chrono::milliseconds(200);
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "200000"}}));
  tb_stream stream = new_stream();
  tb_event timed = new_event();
  tb_event untimed = new_event(0, false);
  tb_event never = new_event();
  float ms = 0;
  EXPECT_OK(rt_->event_record(ctx_, untimed, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  EXPECT_OK(rt_->event_record(ctx_, timed, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));

  EXPECT_EQ(rt_->event_elapsed_time(ctx_, timed, untimed, &ms), TB_ERROR_INVALID_VALUE);
  EXPECT_NE(last_error().find("enable_timing"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->event_elapsed_time(ctx_, never, timed, &ms), TB_ERROR_INVALID_VALUE);
  EXPECT_NE(last_error().find("never been recorded"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->event_elapsed_time(ctx_, timed, timed, nullptr), TB_ERROR_INVALID_VALUE);
  EXPECT_OK(rt_->event_elapsed_time(ctx_, timed, timed, &ms));
  EXPECT_EQ(ms, 0.0f);

  // Re-recording resets the event: pending again until the stream reaches the new record.
  int judged = 0;
  for (int attempt = 0; attempt < 5 && judged == 0; ++attempt) {
    const Clock::time_point recorded = Clock::now();
    ASSERT_OK(rt_->event_record(ctx_, timed, stream));
    const tb_status query = rt_->event_query(ctx_, timed);
    const tb_status elapsed = rt_->event_elapsed_time(ctx_, timed, timed, &ms);
    const std::string message = last_error();
    const bool in_time = Clock::now() - recorded < kLatency;
    EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
    if (!in_time) continue;
    ++judged;
    EXPECT_EQ(query, TB_ERROR_NOT_READY);
    EXPECT_EQ(elapsed, TB_ERROR_NOT_READY);
    EXPECT_NE(message.find("not completed"), std::string::npos) << message;
  }
  EXPECT_EQ(judged, 1);
  EXPECT_OK(rt_->event_elapsed_time(ctx_, timed, timed, &ms));
}

TEST_F(EmuRuntimeEvents, RecordNeedsAStreamOfTheEventsDevice) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  tb_event event = new_event(1);
  tb_stream stream = new_stream(0);
  EXPECT_EQ(rt_->event_record(ctx_, event, stream), TB_ERROR_INVALID_VALUE);
  EXPECT_NE(last_error().find("belongs to device 1"), std::string::npos) << last_error();
  EXPECT_EQ(rt_->event_query(ctx_, event), TB_SUCCESS);  // still never recorded
}

TEST_F(EmuRuntimeEvents, DestroyingAnEventWithAPendingRecordIsSafe) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_LATENCY_US", "20000"}}));
  tb_stream producer = new_stream();
  tb_stream consumer = new_stream();
  tb_event event = new_event();
  EXPECT_OK(rt_->event_record(ctx_, event, producer));
  EXPECT_OK(rt_->stream_wait_event(ctx_, consumer, event));
  EXPECT_OK(rt_->event_destroy(ctx_, event));
  EXPECT_OK(rt_->stream_synchronize(ctx_, consumer));  // the queued wait still completes
  EXPECT_OK(rt_->stream_destroy(ctx_, producer));
  EXPECT_OK(rt_->stream_destroy(ctx_, consumer));
}

// ---- Guarded and unguarded memory -----------------------------------------------------------------

TEST_F(EmuRuntimeGuard, HostReadOfADevicePointerFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the runtime has started threads
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  EXPECT_EQ(properties().host_addressable, 0);
  unsigned char* device = static_cast<unsigned char*>(device_alloc(256));
  const Bytes data = pattern(256, 30);
  write_device(device, data);
  EXPECT_EQ(read_device(device, 256), data);  // the runtime itself can reach the memory
  EXPECT_SEGV({
    const volatile unsigned char value = *static_cast<volatile unsigned char*>(device);
    std::fprintf(stderr, "read %d from device memory\n", value);
    std::exit(0);
  });
  EXPECT_SEGV({
    *static_cast<volatile unsigned char*>(device) = 1;
    std::exit(0);
  });
}

TEST_F(EmuRuntimeGuard, UnguardedDeviceMemoryIsHostAddressable) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_GUARDED", "0"}}));
  const tb_device_properties props = properties();
  EXPECT_EQ(props.host_addressable, 1);
  EXPECT_STREQ(props.architecture, "emu");
  unsigned char* device = static_cast<unsigned char*>(device_alloc(256));
  const Bytes data = pattern(256, 31);
  write_device(device, data);
  EXPECT_EQ(Bytes(device, device + 256), data);  // a plain host read
  device[7] = 0x99;                              // and a plain host write
  EXPECT_EQ(read_device(device, 256)[7], 0x99);
}

// ---- Faults -------------------------------------------------------------------------------------

TEST_F(EmuRuntimeFaults, DropCopySkipsTheFirstLargeHostToDeviceCopy) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_FAULT", "drop-copy"}}));
  void* device = device_alloc(4096);
  tb_stream stream = new_stream();
  EXPECT_OK(rt_->memset_async(ctx_, device, 0, 4096, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));

  const Bytes small = pattern(63, 40);  // below 64 bytes: never dropped
  write_device(device, small);
  EXPECT_EQ(read_device(device, 63), small);

  const Bytes first = pattern(4096, 41);
  EXPECT_OK(rt_->memcpy_sync(ctx_, device, first.data(), 4096, TB_MEMCPY_HOST_TO_DEVICE));  // "succeeds"
  Bytes expected(4096, 0);
  std::copy(small.begin(), small.end(), expected.begin());
  EXPECT_EQ(read_device(device, 4096), expected) << "the first large copy was performed";

  const Bytes second = pattern(4096, 42);
  write_device(device, second);
  EXPECT_EQ(read_device(device, 4096), second) << "only the first large copy may be dropped";
}

TEST_F(EmuRuntimeFaults, DropCopyAlsoHitsAnAsynchronousCopy) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_FAULT", "drop-copy"}}));
  void* device = device_alloc(256);
  tb_stream stream = new_stream();
  EXPECT_OK(rt_->memset_async(ctx_, device, 0x11, 256, stream));
  const Bytes data = pattern(256, 43);
  EXPECT_OK(rt_->memcpy_async(ctx_, device, data.data(), 256, TB_MEMCPY_HOST_TO_DEVICE, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  EXPECT_EQ(read_device(device, 256), Bytes(256, 0x11));
  EXPECT_OK(rt_->memcpy_async(ctx_, device, data.data(), 256, TB_MEMCPY_HOST_TO_DEVICE, stream));
  EXPECT_OK(rt_->stream_synchronize(ctx_, stream));
  EXPECT_EQ(read_device(device, 256), data);
}

TEST_F(EmuRuntimeFaults, CorruptCopyFlipsOneByteOfTheFirstLargeDeviceToHostCopy) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_FAULT", "corrupt-copy"}}));
  const Bytes data = pattern(4096, 50);
  void* device = device_alloc(4096);
  write_device(device, data);  // host to device is never corrupted
  EXPECT_EQ(read_device(device, 32), Bytes(data.begin(), data.begin() + 32));  // small: exact

  const Bytes corrupted = read_device(device, 4096);
  std::vector<std::size_t> differing;
  for (std::size_t i = 0; i < corrupted.size(); ++i) {
    if (corrupted[i] != data[i]) differing.push_back(i);
  }
  ASSERT_EQ(differing.size(), 1u);
  EXPECT_EQ(differing[0], 2048u);
  EXPECT_EQ(corrupted[2048], static_cast<unsigned char>(data[2048] ^ 0xFF));

  EXPECT_EQ(read_device(device, 4096), data);  // later copies are exact, the device copy never changed
}

TEST_F(EmuRuntimeFaults, LeakKeepsShrinkingFreeMemory) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}, {"TORCHBRIDGE_EMU_FAULT", "leak"}}));
  for (int round = 1; round <= 4; ++round) {
    void* block = device_alloc(256 * 1024);
    ASSERT_NE(block, nullptr) << "round " << round;
    device_release(block);  // reports success...
    EXPECT_EQ(free_memory(), kMiB - round * 256 * 1024u) << "round " << round;  // ...but keeps the bytes
    EXPECT_EQ(rt_->device_free(ctx_, 0, block), TB_ERROR_INVALID_POINTER);     // still a double free
  }
  void* pointer = nullptr;
  EXPECT_EQ(rt_->device_malloc(ctx_, 0, 256, &pointer), TB_ERROR_OUT_OF_MEMORY);
}

TEST_F(EmuRuntimeFaults, NoFaultByDefault) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "1M"}}));
  const Bytes data = pattern(4096, 60);
  void* device = device_alloc(4096);
  write_device(device, data);
  EXPECT_EQ(read_device(device, 4096), data);
  device_release(device);
  EXPECT_EQ(free_memory(), kMiB);
}

// ---- Concurrency --------------------------------------------------------------------------------

TEST_F(EmuRuntimeConcurrency, ThreadsAllocateCopyAndFreeAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start({{"TORCHBRIDGE_EMU_MEMORY", "64M"}}));
  constexpr int kThreads = 6;
  constexpr int kRounds = 150;
  std::atomic<int> mismatches{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int32_t home = t % 2;
      const int32_t away = 1 - home;
      if (rt_->set_device(ctx_, home) != TB_SUCCESS) ++failures;
      tb_stream stream = nullptr;
      tb_event event = nullptr;
      if (rt_->stream_create(ctx_, home, 0, &stream) != TB_SUCCESS) ++failures;
      if (rt_->event_create(ctx_, home, 1, &event) != TB_SUCCESS) ++failures;
      std::mt19937 generator(static_cast<unsigned>(t));
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t size = 1 + generator() % 65536;
        const Bytes data = pattern(size, generator());
        void* here = nullptr;
        void* there = nullptr;
        Bytes back(size);
        if (rt_->device_malloc(ctx_, home, size, &here) != TB_SUCCESS ||
            rt_->device_malloc(ctx_, away, size, &there) != TB_SUCCESS ||
            rt_->memcpy_async(ctx_, here, data.data(), size, TB_MEMCPY_HOST_TO_DEVICE, stream) != TB_SUCCESS ||
            rt_->memcpy_async(ctx_, there, here, size, TB_MEMCPY_DEVICE_TO_DEVICE, stream) != TB_SUCCESS ||
            rt_->event_record(ctx_, event, stream) != TB_SUCCESS || rt_->event_synchronize(ctx_, event) != TB_SUCCESS ||
            rt_->memcpy_sync(ctx_, back.data(), there, size, TB_MEMCPY_DEVICE_TO_HOST) != TB_SUCCESS ||
            rt_->device_free(ctx_, home, here) != TB_SUCCESS || rt_->device_free(ctx_, away, there) != TB_SUCCESS) {
          ++failures;
          continue;
        }
        if (back != data) ++mismatches;
      }
      int32_t current = -1;
      rt_->get_device(ctx_, &current);
      if (current != home) ++failures;
      if (rt_->event_destroy(ctx_, event) != TB_SUCCESS || rt_->stream_destroy(ctx_, stream) != TB_SUCCESS) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(free_memory(0), 64 * kMiB);
  EXPECT_EQ(free_memory(1), 64 * kMiB);
}

}  // namespace

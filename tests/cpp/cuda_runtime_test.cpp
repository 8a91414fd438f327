// The SDK's CUDA device runtime (devices/cuda), loaded the way TorchBridge loads it: dlopen and
// tb_runtime_entry. No PyTorch here. The independent reference for "is there a GPU, and what is
// it" is the CUDA runtime itself, called directly. Tests that need a GPU skip with the reason.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "torchbridge/sdk/runtime.h"

namespace {

constexpr const char* kLibraryPath = TORCHBRIDGE_CUDA_DEVICE_LIBRARY_PATH;

// ---- Loading ------------------------------------------------------------------------------------

struct Library {
  void* handle = nullptr;
  tb_runtime_entry_fn entry = nullptr;
  std::string error;
};

// Opened once and never closed, as TorchBridge does (the returned table must outlive its users).
const Library& library() {
  static const Library loaded = [] {
    Library lib;
    lib.handle = dlopen(kLibraryPath, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle == nullptr) {
      lib.error = dlerror();
      return lib;
    }
    lib.entry = reinterpret_cast<tb_runtime_entry_fn>(dlsym(lib.handle, TB_RUNTIME_ENTRY_SYMBOL));
    if (lib.entry == nullptr) lib.error = std::string("dlsym: ") + dlerror();
    return lib;
  }();
  return loaded;
}

// What the CUDA runtime says when asked directly.
struct Reference {
  cudaError_t error = cudaSuccess;
  int count = 0;

  bool has_device() const { return error == cudaSuccess && count > 0; }
  std::string reason() const {
    if (error != cudaSuccess) {
      return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error);
    }
    return "cudaGetDeviceCount reports 0 devices";
  }
};

Reference reference() {
  Reference r;
  r.error = cudaGetDeviceCount(&r.count);
  (void)cudaGetLastError();
  return r;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Bytes that differ from their neighbours, so a shifted, truncated or partly stale copy shows.
std::vector<uint8_t> pattern(size_t bytes, uint64_t seed) {
  std::vector<uint8_t> out(bytes);
  uint64_t x = seed;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<uint8_t>(x >> 56);
  }
  return out;
}

// ---- Without a GPU and with one ---------------------------------------------------------------

TEST(CudaRuntimeLibrary, ExportsTheEntry) {
  ASSERT_NE(library().handle, nullptr) << library().error;
  EXPECT_NE(library().entry, nullptr) << library().error;
}

TEST(CudaRuntimeLibrary, ExportsNothingElse) {
  std::unique_ptr<FILE, int (*)(FILE*)> nm(
      popen(("nm -D --defined-only '" + std::string(kLibraryPath) + "' 2>/dev/null").c_str(), "r"),
      pclose);
  if (!nm) GTEST_SKIP() << "cannot run nm";
  std::vector<std::string> exported;
  char line[1024];
  while (fgets(line, sizeof(line), nm.get()) != nullptr) {
    char address[64], type[8], name[900];
    if (std::sscanf(line, "%63s %7s %899s", address, type, name) == 3) exported.push_back(name);
  }
  if (pclose(nm.release()) != 0 && exported.empty()) GTEST_SKIP() << "nm is not available";
  // Linker-defined markers some toolchains still put into .dynsym.
  const std::set<std::string> standard = {"_init", "_fini", "__bss_start", "_edata", "_end"};
  bool has_entry = false;
  for (const std::string& name : exported) {
    if (name == TB_RUNTIME_ENTRY_SYMBOL) {
      has_entry = true;
    } else {
      EXPECT_TRUE(standard.count(name)) << "unexpected exported symbol: " << name;
    }
  }
  EXPECT_TRUE(has_entry);
}

TEST(CudaRuntimeLibrary, RefusesToLoadWithoutADevice) {
  const Reference ref = reference();
  if (ref.has_device()) GTEST_SKIP() << "a CUDA device is present; the GPU tests cover loading";
  ASSERT_NE(library().entry, nullptr) << library().error;

  const char* message = nullptr;
  EXPECT_EQ(library().entry(&message), nullptr);
  ASSERT_NE(message, nullptr);
  const std::string text = message;
  EXPECT_TRUE(contains(text, "CUDA")) << text;
  if (ref.error != cudaSuccess) {
    EXPECT_TRUE(contains(text, cudaGetErrorString(ref.error))) << text;
  } else {
    EXPECT_TRUE(contains(text, "no CUDA device")) << text;
  }

  // The answer is stable, its sentence long-lived, and a NULL error_message is tolerated.
  const char* again = nullptr;
  EXPECT_EQ(library().entry(&again), nullptr);
  EXPECT_EQ(again, message);
  EXPECT_EQ(library().entry(nullptr), nullptr);
  std::printf("tb_runtime_entry: %s\n", message);
  // (Whether CUDA's per-thread error is clear afterwards is not checked here: without a driver,
  // CUDA's initialization error is permanent and every later call returns it again.)
}

// ---- With a GPU --------------------------------------------------------------------------------

class CudaRuntimeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ref_ = reference();
    if (!ref_.has_device()) GTEST_SKIP() << "no CUDA device: " << ref_.reason();
    ASSERT_NE(library().entry, nullptr) << library().error;
    const char* message = nullptr;
    rt_ = library().entry(&message);
    ASSERT_NE(rt_, nullptr) << (message ? message : "(no message)");
  }

  void* ctx() const { return rt_->context; }
  std::string last_error() const { return rt_->last_error_message(rt_->context); }

  Reference ref_;
  const tb_runtime* rt_ = nullptr;
};

#define TB_ASSERT_OK(call) ASSERT_EQ((call), TB_SUCCESS) << #call << ": " << last_error()
#define TB_EXPECT_OK(call) EXPECT_EQ((call), TB_SUCCESS) << #call << ": " << last_error()

TEST_F(CudaRuntimeGpu, DescribesItself) {
  EXPECT_EQ(rt_->struct_size, sizeof(tb_runtime));
  EXPECT_EQ(rt_->abi_version, TB_RUNTIME_ABI_VERSION);
  ASSERT_NE(rt_->name, nullptr);
  EXPECT_STREQ(rt_->name, "cudasdk");

  // Every entry is filled in: the table is laid out as function pointers after `context`.
  const auto* first = reinterpret_cast<const char*>(&rt_->status_string);
  const auto* end = reinterpret_cast<const char*>(rt_) + sizeof(tb_runtime);
  for (const char* p = first; p < end; p += sizeof(void*)) {
    void* entry = nullptr;
    std::memcpy(&entry, p, sizeof(void*));
    EXPECT_NE(entry, nullptr) << "entry at offset " << (p - reinterpret_cast<const char*>(rt_));
  }

  std::set<std::string> texts;
  for (tb_status s : {TB_SUCCESS, TB_ERROR_INVALID_VALUE, TB_ERROR_INVALID_DEVICE,
                      TB_ERROR_OUT_OF_MEMORY, TB_ERROR_INVALID_POINTER, TB_ERROR_NOT_READY,
                      TB_ERROR_INVALID_HANDLE, TB_ERROR_NOT_SUPPORTED, TB_ERROR_DEVICE_FAILURE,
                      TB_ERROR_UNKNOWN, static_cast<tb_status>(77)}) {
    const char* text = rt_->status_string(ctx(), s);
    ASSERT_NE(text, nullptr);
    EXPECT_GT(std::strlen(text), 0u);
    texts.insert(text);
  }
  EXPECT_EQ(texts.size(), 11u) << "every status has its own text";

  int32_t count = -1;
  TB_ASSERT_OK(rt_->device_count(ctx(), &count));
  EXPECT_EQ(count, ref_.count);
  EXPECT_GE(count, 1);
}

TEST_F(CudaRuntimeGpu, PropertiesMatchCudaGetDeviceProperties) {
  int driver = 0;
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  const std::string driver_text =
      std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  for (int32_t d = 0; d < ref_.count; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    tb_device_properties p;
    std::memset(&p, 0xff, sizeof(p));  // every field must be written
    TB_ASSERT_OK(rt_->device_properties(ctx(), d, &p));

    EXPECT_STREQ(p.name, prop.name);
    EXPECT_STREQ(p.vendor, "NVIDIA");
    EXPECT_EQ(std::string(p.architecture),
              "sm_" + std::to_string(prop.major) + std::to_string(prop.minor));
    EXPECT_EQ(std::string(p.driver_version), driver_text);
    EXPECT_EQ(p.total_memory_bytes, prop.totalGlobalMem);
    EXPECT_GT(p.free_memory_bytes, 0u);
    EXPECT_LE(p.free_memory_bytes, p.total_memory_bytes);
    EXPECT_EQ(p.multiprocessor_count, prop.multiProcessorCount);
    // Host code may touch cudaMalloc memory only with hardware coherence (ATS over NVLink-C2C).
    EXPECT_EQ(p.host_addressable,
              prop.pageableMemoryAccess && prop.pageableMemoryAccessUsesHostPageTables ? 1 : 0);
    EXPECT_EQ(p.is_real_hardware, 1);
  }
  tb_device_properties p;
  EXPECT_EQ(rt_->device_properties(ctx(), ref_.count, &p), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->device_properties(ctx(), 0, nullptr), TB_ERROR_INVALID_VALUE);
}

TEST_F(CudaRuntimeGpu, CurrentDeviceIsCudas) {
  for (int32_t d = 0; d < ref_.count; ++d) {
    TB_ASSERT_OK(rt_->set_device(ctx(), d));
    int32_t current = -1;
    TB_ASSERT_OK(rt_->get_device(ctx(), &current));
    EXPECT_EQ(current, d);
    int cuda_current = -1;
    ASSERT_EQ(cudaGetDevice(&cuda_current), cudaSuccess);
    EXPECT_EQ(cuda_current, d);
  }
  EXPECT_EQ(rt_->set_device(ctx(), ref_.count), TB_ERROR_INVALID_DEVICE);
  EXPECT_TRUE(contains(last_error(), "does not exist")) << last_error();
  EXPECT_EQ(rt_->set_device(ctx(), -1), TB_ERROR_INVALID_DEVICE);
}

TEST_F(CudaRuntimeGpu, PerDeviceEntriesRestoreTheCurrentDevice) {
  const int32_t last = ref_.count - 1;
  TB_ASSERT_OK(rt_->set_device(ctx(), last));
  for (int32_t d = 0; d < ref_.count; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    tb_device_properties p;
    TB_ASSERT_OK(rt_->device_properties(ctx(), d, &p));
    TB_ASSERT_OK(rt_->device_synchronize(ctx(), d));
    void* memory = nullptr;
    TB_ASSERT_OK(rt_->device_malloc(ctx(), d, 4096, &memory));
    tb_stream stream = nullptr;
    TB_ASSERT_OK(rt_->stream_create(ctx(), d, 0, &stream));
    tb_event event = nullptr;
    TB_ASSERT_OK(rt_->event_create(ctx(), d, 0, &event));
    TB_ASSERT_OK(rt_->memset_async(ctx(), memory, 7, 4096, stream));
    TB_ASSERT_OK(rt_->event_record(ctx(), event, stream));
    TB_ASSERT_OK(rt_->event_synchronize(ctx(), event));

    // The allocation landed on device d, whatever was current.
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, memory), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attributes.device, d);

    TB_EXPECT_OK(rt_->event_destroy(ctx(), event));
    TB_EXPECT_OK(rt_->stream_destroy(ctx(), stream));
    TB_EXPECT_OK(rt_->device_free(ctx(), d, memory));
    int32_t current = -1;
    TB_ASSERT_OK(rt_->get_device(ctx(), &current));
    EXPECT_EQ(current, last);
  }
}

TEST_F(CudaRuntimeGpu, SyncCopiesRoundTripBitExactly) {
  // An odd size, from pageable memory: cudaMemcpy returns early for pageable host-to-device and
  // for device-to-device copies, and the SDK promises the bytes have arrived.
  const size_t bytes = (16u << 20) + 13;
  const std::vector<uint8_t> source = pattern(bytes, 1);
  void* a = nullptr;
  void* b = nullptr;
  TB_ASSERT_OK(rt_->device_malloc(ctx(), 0, bytes, &a));
  TB_ASSERT_OK(rt_->device_malloc(ctx(), ref_.count - 1, bytes, &b));  // across GPUs when there are

  TB_ASSERT_OK(rt_->memcpy_sync(ctx(), a, source.data(), bytes, TB_MEMCPY_HOST_TO_DEVICE));
  TB_ASSERT_OK(rt_->memcpy_sync(ctx(), b, a, bytes, TB_MEMCPY_DEVICE_TO_DEVICE));
  std::vector<uint8_t> back(bytes, 0);
  TB_ASSERT_OK(rt_->memcpy_sync(ctx(), back.data(), b, bytes, TB_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(back.data(), source.data(), bytes), 0);

  // The same through pinned memory from host_malloc.
  void* pinned = nullptr;
  TB_ASSERT_OK(rt_->host_malloc(ctx(), bytes, &pinned));
  const std::vector<uint8_t> second = pattern(bytes, 2);
  std::memcpy(pinned, second.data(), bytes);
  TB_ASSERT_OK(rt_->memcpy_sync(ctx(), a, pinned, bytes, TB_MEMCPY_HOST_TO_DEVICE));
  std::memset(pinned, 0, bytes);
  TB_ASSERT_OK(rt_->memcpy_sync(ctx(), pinned, a, bytes, TB_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(pinned, second.data(), bytes), 0);

  TB_EXPECT_OK(rt_->memcpy_sync(ctx(), nullptr, nullptr, 0, TB_MEMCPY_HOST_TO_DEVICE));
  EXPECT_EQ(rt_->memcpy_sync(ctx(), a, pinned, 16, static_cast<tb_memcpy_kind>(42)),
            TB_ERROR_INVALID_VALUE);
  EXPECT_EQ(rt_->memcpy_sync(ctx(), nullptr, pinned, 16, TB_MEMCPY_HOST_TO_DEVICE),
            TB_ERROR_INVALID_VALUE);

  TB_EXPECT_OK(rt_->host_free(ctx(), pinned));
  TB_EXPECT_OK(rt_->device_free(ctx(), 0, a));
  TB_EXPECT_OK(rt_->device_free(ctx(), ref_.count - 1, b));
}

TEST_F(CudaRuntimeGpu, AsyncCopiesAndEventTiming) {
  const size_t bytes = 64u << 20;
  const std::vector<uint8_t> source = pattern(bytes, 3);
  void* host_in = nullptr;
  void* host_out = nullptr;
  void* device = nullptr;
  TB_ASSERT_OK(rt_->host_malloc(ctx(), bytes, &host_in));
  TB_ASSERT_OK(rt_->host_malloc(ctx(), bytes, &host_out));
  TB_ASSERT_OK(rt_->device_malloc(ctx(), 0, bytes, &device));
  std::memcpy(host_in, source.data(), bytes);
  std::memset(host_out, 0, bytes);

  tb_stream stream = nullptr;
  tb_event start = nullptr;
  tb_event end = nullptr;
  TB_ASSERT_OK(rt_->stream_create(ctx(), 0, 0, &stream));
  TB_ASSERT_OK(rt_->event_create(ctx(), 0, 1, &start));
  TB_ASSERT_OK(rt_->event_create(ctx(), 0, 1, &end));

  const size_t tail = 4096;  // the last bytes are overwritten by a memset in between
  TB_ASSERT_OK(rt_->event_record(ctx(), start, stream));
  TB_ASSERT_OK(rt_->memcpy_async(ctx(), device, host_in, bytes, TB_MEMCPY_HOST_TO_DEVICE, stream));
  TB_ASSERT_OK(rt_->memset_async(ctx(), static_cast<uint8_t*>(device) + bytes - tail, 0x5a, tail,
                                 stream));
  TB_ASSERT_OK(rt_->memcpy_async(ctx(), host_out, device, bytes, TB_MEMCPY_DEVICE_TO_HOST, stream));
  TB_ASSERT_OK(rt_->event_record(ctx(), end, stream));
  TB_ASSERT_OK(rt_->event_synchronize(ctx(), end));

  EXPECT_EQ(rt_->event_query(ctx(), end), TB_SUCCESS);
  EXPECT_EQ(rt_->stream_query(ctx(), stream), TB_SUCCESS);
  float ms = -1.0f;
  TB_ASSERT_OK(rt_->event_elapsed_time(ctx(), start, end, &ms));
  EXPECT_GE(ms, 0.0f);

  const auto* out = static_cast<const uint8_t*>(host_out);
  EXPECT_EQ(std::memcmp(out, source.data(), bytes - tail), 0);
  for (size_t i = bytes - tail; i < bytes; ++i) ASSERT_EQ(out[i], 0x5a) << "byte " << i;

  // Events without timing cannot be timed.
  tb_event untimed = nullptr;
  TB_ASSERT_OK(rt_->event_create(ctx(), 0, 0, &untimed));
  TB_ASSERT_OK(rt_->event_record(ctx(), untimed, stream));
  TB_ASSERT_OK(rt_->stream_synchronize(ctx(), stream));
  EXPECT_NE(rt_->event_elapsed_time(ctx(), start, untimed, &ms), TB_SUCCESS);
  EXPECT_FALSE(last_error().empty());

  for (tb_event e : {start, end, untimed}) TB_EXPECT_OK(rt_->event_destroy(ctx(), e));
  TB_EXPECT_OK(rt_->stream_destroy(ctx(), stream));
  TB_EXPECT_OK(rt_->device_free(ctx(), 0, device));
  TB_EXPECT_OK(rt_->host_free(ctx(), host_in));
  TB_EXPECT_OK(rt_->host_free(ctx(), host_out));
}

TEST_F(CudaRuntimeGpu, StreamWaitEventOrdersTwoStreams) {
  // Stream A uploads a large buffer; stream B waits for A's event and downloads it. Only B is
  // synchronized: without the wait, B's download would run alongside A's upload (separate copy
  // engines) and read a zeroed or half-written buffer.
  const size_t bytes = 256u << 20;
  const std::vector<uint8_t> source = pattern(bytes, 4);
  void* upload = nullptr;
  void* download = nullptr;
  void* device = nullptr;
  TB_ASSERT_OK(rt_->host_malloc(ctx(), bytes, &upload));
  TB_ASSERT_OK(rt_->host_malloc(ctx(), bytes, &download));
  TB_ASSERT_OK(rt_->device_malloc(ctx(), 0, bytes, &device));
  std::memcpy(upload, source.data(), bytes);
  std::memset(download, 0xee, bytes);

  tb_stream a = nullptr;
  tb_stream b = nullptr;
  tb_event uploaded = nullptr;
  TB_ASSERT_OK(rt_->stream_create(ctx(), 0, 0, &a));
  TB_ASSERT_OK(rt_->stream_create(ctx(), 0, 0, &b));
  TB_ASSERT_OK(rt_->event_create(ctx(), 0, 0, &uploaded));

  TB_ASSERT_OK(rt_->memset_async(ctx(), device, 0, bytes, b));
  TB_ASSERT_OK(rt_->stream_synchronize(ctx(), b));

  TB_ASSERT_OK(rt_->memcpy_async(ctx(), device, upload, bytes, TB_MEMCPY_HOST_TO_DEVICE, a));
  TB_ASSERT_OK(rt_->event_record(ctx(), uploaded, a));
  TB_ASSERT_OK(rt_->stream_wait_event(ctx(), b, uploaded));
  TB_ASSERT_OK(rt_->memcpy_async(ctx(), download, device, bytes, TB_MEMCPY_DEVICE_TO_HOST, b));
  TB_ASSERT_OK(rt_->stream_synchronize(ctx(), b));

  EXPECT_EQ(std::memcmp(download, source.data(), bytes), 0);
  // B finished after A's event, so the event has been reached.
  EXPECT_EQ(rt_->event_query(ctx(), uploaded), TB_SUCCESS);

  TB_EXPECT_OK(rt_->stream_synchronize(ctx(), a));
  TB_EXPECT_OK(rt_->event_destroy(ctx(), uploaded));
  TB_EXPECT_OK(rt_->stream_destroy(ctx(), a));
  TB_EXPECT_OK(rt_->stream_destroy(ctx(), b));
  TB_EXPECT_OK(rt_->device_free(ctx(), 0, device));
  TB_EXPECT_OK(rt_->host_free(ctx(), upload));
  TB_EXPECT_OK(rt_->host_free(ctx(), download));
}

TEST_F(CudaRuntimeGpu, QueriesReportPendingWorkAsNotReady) {
  const size_t bytes = 256u << 20;
  void* host = nullptr;
  void* device = nullptr;
  TB_ASSERT_OK(rt_->host_malloc(ctx(), bytes, &host));
  TB_ASSERT_OK(rt_->device_malloc(ctx(), 0, bytes, &device));
  tb_stream stream = nullptr;
  tb_event done = nullptr;
  TB_ASSERT_OK(rt_->stream_create(ctx(), 0, 0, &stream));
  TB_ASSERT_OK(rt_->event_create(ctx(), 0, 0, &done));

  // A few milliseconds of copying; the queries right after usually see it still running, but a
  // fast machine may not, so either answer is accepted — what matters is that busy is NOT_READY
  // rather than an error, and that it leaves no CUDA error behind.
  for (int i = 0; i < 4; ++i) {
    TB_ASSERT_OK(rt_->memcpy_async(ctx(), device, host, bytes, TB_MEMCPY_HOST_TO_DEVICE, stream));
  }
  TB_ASSERT_OK(rt_->event_record(ctx(), done, stream));
  const tb_status stream_state = rt_->stream_query(ctx(), stream);
  const tb_status event_state = rt_->event_query(ctx(), done);
  EXPECT_TRUE(stream_state == TB_SUCCESS || stream_state == TB_ERROR_NOT_READY) << stream_state;
  EXPECT_TRUE(event_state == TB_SUCCESS || event_state == TB_ERROR_NOT_READY) << event_state;
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  if (stream_state == TB_SUCCESS) std::printf("note: the copies finished before the first query\n");

  TB_ASSERT_OK(rt_->stream_synchronize(ctx(), stream));
  EXPECT_EQ(rt_->stream_query(ctx(), stream), TB_SUCCESS);
  EXPECT_EQ(rt_->event_query(ctx(), done), TB_SUCCESS);

  // Priorities outside CUDA's range are clamped, not refused.
  for (int32_t priority : {-100, -1, 0, 1, 100}) {
    tb_stream s = nullptr;
    TB_EXPECT_OK(rt_->stream_create(ctx(), 0, priority, &s));
    if (s != nullptr) {
      TB_EXPECT_OK(rt_->stream_destroy(ctx(), s));
    }
  }

  TB_EXPECT_OK(rt_->event_destroy(ctx(), done));
  TB_EXPECT_OK(rt_->stream_destroy(ctx(), stream));
  TB_EXPECT_OK(rt_->device_free(ctx(), 0, device));
  TB_EXPECT_OK(rt_->host_free(ctx(), host));
}

TEST_F(CudaRuntimeGpu, AllocationBeyondTotalMemoryIsOutOfMemory) {
  tb_device_properties p;
  TB_ASSERT_OK(rt_->device_properties(ctx(), 0, &p));
  const size_t request = static_cast<size_t>(p.total_memory_bytes) + (size_t{1} << 30);
  void* memory = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(rt_->device_malloc(ctx(), 0, request, &memory), TB_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(memory, nullptr);
  const std::string message = last_error();
  std::printf("device_malloc(%zu): %s\n", request, message.c_str());
  EXPECT_TRUE(contains(message, "requested " + std::to_string(request) + " bytes")) << message;
  EXPECT_TRUE(contains(message, "free")) << message;
  EXPECT_TRUE(contains(message, "cudaMalloc")) << message;
  // The failure is not left behind in CUDA's per-thread error, and the device still works.
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  TB_ASSERT_OK(rt_->device_malloc(ctx(), 0, 1 << 20, &memory));
  EXPECT_NE(memory, nullptr);
  TB_EXPECT_OK(rt_->device_free(ctx(), 0, memory));
}

TEST_F(CudaRuntimeGpu, BadHandlesAndPointersAreReported) {
  EXPECT_EQ(rt_->stream_query(ctx(), nullptr), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->event_query(ctx(), nullptr), TB_ERROR_INVALID_HANDLE);

  tb_stream stream = nullptr;
  tb_event event = nullptr;
  TB_ASSERT_OK(rt_->stream_create(ctx(), 0, 0, &stream));
  TB_ASSERT_OK(rt_->event_create(ctx(), 0, 0, &event));
  TB_ASSERT_OK(rt_->stream_destroy(ctx(), stream));
  TB_ASSERT_OK(rt_->event_destroy(ctx(), event));
  EXPECT_EQ(rt_->stream_destroy(ctx(), stream), TB_ERROR_INVALID_HANDLE);
  EXPECT_TRUE(contains(last_error(), "destroyed")) << last_error();
  EXPECT_EQ(rt_->event_destroy(ctx(), event), TB_ERROR_INVALID_HANDLE);
  EXPECT_EQ(rt_->stream_synchronize(ctx(), stream), TB_ERROR_INVALID_HANDLE);

  // Memory this runtime did not allocate.
  int on_the_stack = 0;
  EXPECT_EQ(rt_->device_free(ctx(), 0, &on_the_stack), TB_ERROR_INVALID_POINTER) << last_error();
  EXPECT_EQ(rt_->host_free(ctx(), &on_the_stack), TB_ERROR_INVALID_POINTER) << last_error();
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  TB_EXPECT_OK(rt_->device_free(ctx(), 0, nullptr));
  TB_EXPECT_OK(rt_->host_free(ctx(), nullptr));

  void* memory = nullptr;
  EXPECT_EQ(rt_->device_malloc(ctx(), ref_.count, 16, &memory), TB_ERROR_INVALID_DEVICE);
  EXPECT_EQ(rt_->stream_create(ctx(), -1, 0, &stream), TB_ERROR_INVALID_DEVICE);

  if (ref_.count >= 2) {
    tb_stream on_one = nullptr;
    tb_event on_zero = nullptr;
    TB_ASSERT_OK(rt_->stream_create(ctx(), 1, 0, &on_one));
    TB_ASSERT_OK(rt_->event_create(ctx(), 0, 0, &on_zero));
    EXPECT_EQ(rt_->event_record(ctx(), on_zero, on_one), TB_ERROR_INVALID_VALUE);
    // Waiting across devices is allowed.
    TB_ASSERT_OK(rt_->stream_create(ctx(), 0, 0, &stream));
    TB_EXPECT_OK(rt_->event_record(ctx(), on_zero, stream));
    TB_EXPECT_OK(rt_->stream_wait_event(ctx(), on_one, on_zero));
    TB_EXPECT_OK(rt_->stream_synchronize(ctx(), on_one));
    TB_EXPECT_OK(rt_->stream_destroy(ctx(), stream));
    TB_EXPECT_OK(rt_->stream_destroy(ctx(), on_one));
    TB_EXPECT_OK(rt_->event_destroy(ctx(), on_zero));
  }
}

}  // namespace

// Device SDK behaviour beyond the backend contract: loading and registration errors, the
// fallback counters and strict mode, device mismatches, and how the backend layer sees the device.
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <gtest/gtest.h>

#include "collect_warnings.h"
#include "error_message.h"
#include "sdk/stream_registry.h"

#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>  // c10::impl::device_guard_impl_registry
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace torchbridge::sdk {
namespace {

using test_support::error_of;

c10::Device emu(int index = 0) {
  load_device("emu");
  return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
}

// A device loads once per process (PyTorch cannot unregister a PrivateUse1 backend), so the tests
// of loading itself need a process where none is loaded yet. CTest runs every test in a process of
// its own; run all in one gtest process (`build/bin/sdk_tests`), they skip saying why instead of
// failing on what an earlier test loaded.
constexpr const char* kNeedsAFreshProcess =
    "needs a process where no device is loaded yet (CTest gives it one; run it alone with --gtest_filter)";

// A device is loaded by the name in its file, libtorchbridge_device_NAME.so, and must register
// that same name; the CUDA runtime was once built as ..._cuda.so while registering "cudasdk", so
// `devices.load("cudasdk")` could not find it.
TEST(Sdk, EveryDeviceLibraryRegistersTheNameItsFileCarries) {
  const auto names = available_devices();
  ASSERT_NE(std::find(names.begin(), names.end(), "emu"), names.end());
#ifdef TORCHBRIDGE_BUILT_CUDASDK
  EXPECT_NE(std::find(names.begin(), names.end(), "cudasdk"), names.end())
      << "the CUDA toolkit was found at build time, so libtorchbridge_device_cudasdk.so must be there";
#endif
  Dl_info self{};
  ASSERT_NE(dladdr(reinterpret_cast<const void*>(&load_device), &self), 0);
  const std::string library_dir = std::string(self.dli_fname).substr(0, std::string(self.dli_fname).rfind('/'));
  for (const auto& name : names) {
    const std::string path = library_dir + "/libtorchbridge_device_" + name + ".so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle, nullptr) << dlerror();
    const auto entry = reinterpret_cast<tb_runtime_entry_fn>(dlsym(handle, TB_RUNTIME_ENTRY_SYMBOL));
    ASSERT_NE(entry, nullptr) << path;
    const char* error = nullptr;
    const tb_runtime* table = entry(&error);
    if (table == nullptr) {
      // A device whose hardware is absent cannot start (cudasdk without a GPU); it says why.
      EXPECT_NE(error, nullptr) << path;
      continue;
    }
    EXPECT_STREQ(table->name, name.c_str()) << path;
  }
}

// native_batch_norm's schema does not mark the running statistics as written; a fallback that
// trusts the schema drops their update (found through the Python training-state tests).
TEST(Sdk, BatchNormTrainingUpdatesRunningStatisticsLikeTheCpu) {
  const at::Tensor x = at::randn({8, 3, 4, 4});
  at::Tensor cpu_mean = at::zeros({3}), cpu_var = at::ones({3});
  at::Tensor emu_mean = cpu_mean.to(emu()), emu_var = cpu_var.to(emu());
  const at::Tensor cpu_out = at::batch_norm(x, {}, {}, cpu_mean, cpu_var, true, 0.1, 1e-5, false);
  const at::Tensor emu_out = at::batch_norm(x.to(emu()), {}, {}, emu_mean, emu_var, true, 0.1, 1e-5, false);
  EXPECT_FALSE(at::equal(cpu_mean, at::zeros({3})));  // the reference really moved
  EXPECT_TRUE(at::equal(emu_mean.cpu(), cpu_mean));
  EXPECT_TRUE(at::equal(emu_var.cpu(), cpu_var));
  EXPECT_TRUE(at::equal(emu_out.cpu(), cpu_out));
}

TEST(Sdk, LoadingByBackendNameRegistersTheDevice) {
  if (registered_device()) GTEST_SKIP() << kNeedsAFreshProcess;
  const auto backend = create_backend("emu");  // no other step
  EXPECT_EQ(registered_device(), "emu");
  EXPECT_EQ(c10::get_privateuse1_backend(), "emu");
  EXPECT_EQ(backend->device_count(), 2);
  const DeviceInfo info = backend->info(1);
  EXPECT_EQ(info.name, "TorchBridge emulated accelerator");
  EXPECT_EQ(info.vendor, "TorchBridge");
  EXPECT_EQ(info.total_memory_bytes, 1ull << 30);
  EXPECT_FALSE(backend->is_real_hardware());
  const auto devices = available_devices();
  EXPECT_NE(std::find(devices.begin(), devices.end(), "emu"), devices.end());
  EXPECT_FALSE(autograd_refusal().has_value());  // loaded before any backward pass
}

// The devices autograd's engine gives a queue (and a thread) when it starts, as it counts them:
// the most numerous device type that does not run on the CPU's queue. None on a CPU machine, one
// per GPU on a GPU machine (CUDA's guard counts them whether or not CUDA was used).
int devices_with_autograd_queues() {
  int most = 0;
  for (const auto& registered : c10::impl::device_guard_impl_registry) {
    const c10::impl::DeviceGuardImplInterface* impl = registered.load();
    if (impl == nullptr) continue;
    const c10::DeviceType type = impl->type();
    if (type == c10::DeviceType::CPU || type == c10::DeviceType::Meta || type == c10::DeviceType::Lazy) continue;
    most = std::max(most, static_cast<int>(impl->deviceCount()));
  }
  return most;
}

// A backward pass of 3 * leaf on emu device `index`: the leaf's gradient, or PyTorch's error.
std::string backward_on_emu(int index) {
  const at::Tensor leaf = at::ones({2}, at::TensorOptions().device(emu(index))).requires_grad_(true);
  const at::Tensor loss = at::mul(leaf, 3).sum();
  EXPECT_EQ(loss.item<float>(), 6.0f) << "forward passes work on emu:" << index;
  const std::string failure = error_of([&] { loss.backward(); });
  if (failure != "<no error>") return failure;
  return leaf.grad().cpu().equal(at::full({2}, 3.0f)) ? "gradient 3" : "wrong gradient";
}

// PyTorch's autograd engine sizes its device queues at the process's first backward pass; a device
// index loaded after one beyond those queues cannot run backward (PyTorch's internal assertion).
// Loading says so, and what it says is what PyTorch then does.
TEST(Sdk, LoadingAfterTheFirstBackwardPassWarnsThatAutogradCannotServeTheDevice) {
  if (registered_device()) GTEST_SKIP() << kNeedsAFreshProcess;
  const at::Tensor cpu_leaf = at::ones({2}).requires_grad_(true);
  at::mul(cpu_leaf, 3).sum().backward();  // the process's first backward pass, on the CPU
  const int served = devices_with_autograd_queues();

  std::vector<std::string> warnings;
  {
    const test_support::CollectWarnings collected;
    load_device("emu");
    warnings = collected.messages;
  }
  const int emu_devices = c10::impl::VirtualGuardImpl(c10::DeviceType::PrivateUse1).deviceCount();
  if (served >= emu_devices) {
    EXPECT_FALSE(autograd_refusal().has_value()) << *autograd_refusal();
    EXPECT_TRUE(warnings.empty());
    EXPECT_EQ(backward_on_emu(emu_devices - 1), "gradient 3");
    GTEST_SKIP() << "this machine's " << served << " devices gave autograd a queue for each of emu's " << emu_devices
                 << ": nothing to warn about (checked that it does not)";
  }
  ASSERT_TRUE(autograd_refusal().has_value());
  const std::string why = autograd_refusal().value_or("");
  EXPECT_NE(why.find("'emu' was loaded after this process's first backward pass"), std::string::npos) << why;
  EXPECT_NE(why.find("for " + std::to_string(served) + " device(s)"), std::string::npos) << why;
  EXPECT_NE(why.find("load it before the first backward pass"), std::string::npos) << why;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], why);
  // Forward passes work; a backward pass on the first index without a queue fails inside
  // PyTorch, as the warning said, and one on an index with a queue (a GPU machine's) works.
  const std::string failure = backward_on_emu(served);
  EXPECT_NE(failure.find("device_ready_queues_"), std::string::npos) << failure;
  if (served > 0) {
    EXPECT_EQ(backward_on_emu(0), "gradient 3");
  }
}

// torch.Stream(), torch.cuda.Stream() under redirection and c10's getNewStream take streams from
// pools, as CUDA's do. They used to create a runtime stream each (an emu worker thread), never
// destroyed: a program making a stream per iteration grew by a thread per iteration.
TEST(Sdk, NewStreamsComeFromAPoolPerPriority) {
  const c10::Device device = emu();
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  const auto ids_of = [&](int priority) {
    std::set<c10::StreamId> ids;
    c10::StreamId previous = -1;
    for (int i = 0; i < 5 * kStreamPoolSize; ++i) {
      const c10::StreamId id = guard.getNewStream(device, priority).id();
      EXPECT_NE(id, previous) << "two streams asked for in a row must differ";
      previous = id;
      ids.insert(id);
    }
    return ids;
  };
  const std::set<c10::StreamId> normal = ids_of(0), high = ids_of(-1), highest = ids_of(kHighestStreamPriority);
  EXPECT_EQ(normal.size(), static_cast<size_t>(kStreamPoolSize));
  EXPECT_EQ(high.size(), static_cast<size_t>(kStreamPoolSize));
  EXPECT_EQ(normal.count(0), 0u) << "the default stream is not handed out";
  for (const c10::StreamId id : high) {
    EXPECT_EQ(normal.count(id), 0u) << "priority -1 shares stream " << id << " with priority 0";
    EXPECT_EQ(highest.count(id), 0u);
  }
  // Out-of-range priorities are clamped, as torch clamps CUDA's: no new pools.
  EXPECT_EQ(ids_of(7), normal);
  EXPECT_EQ(ids_of(-100), highest);
  // The priority each stream was created with, as torch.cuda.Stream.priority answers it.
  EXPECT_EQ(stream_priority(guard.getNewStream(device, -1)), -1);
  EXPECT_EQ(stream_priority(guard.getNewStream(device, -100)), kHighestStreamPriority);
  EXPECT_EQ(stream_priority(guard.getDefaultStream(device)), 0);
  EXPECT_NE(error_of([] { stream_priority(c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU))); })
                .find("is not a stream of the SDK device"),
            std::string::npos);
  EXPECT_NE(error_of([&] { stream_priority(c10::Stream(c10::Stream::UNSAFE, device, 100000)); })
                .find("unknown stream id 100000"),
            std::string::npos);
  EXPECT_EQ(high.count(guard.getStreamFromGlobalPool(device, /*isHighPriority=*/true).id()), 1u);
  EXPECT_EQ(normal.count(guard.getStreamFromGlobalPool(device, /*isHighPriority=*/false).id()), 1u);
  // Work on a pooled stream still runs and is waited for.
  const c10::Stream stream = guard.getNewStream(device, -1);
  {
    const c10::StreamGuard on_stream(stream);
    const at::Tensor t = at::arange(1000, at::TensorOptions().dtype(at::kLong).device(device));
    EXPECT_EQ(t.sum().item<int64_t>(), 999 * 1000 / 2);
  }
  stream.synchronize();
  EXPECT_TRUE(stream.query());
}

TEST(Sdk, DetectionDoesNotPreferAnEmulatorOverTheCpu) {
  load_device("emu");
  unsetenv("TORCHBRIDGE_BACKEND");
  if (BackendRegistry::instance().lookup("cuda")->is_available()) GTEST_SKIP() << "a GPU outranks both";
  EXPECT_EQ(detect_best_backend(), "cpu");
  setenv("TORCHBRIDGE_BACKEND", "emu", 1);
  EXPECT_EQ(detect_best_backend(), "emu");
  unsetenv("TORCHBRIDGE_BACKEND");
}

TEST(Sdk, CapacityIsConfigurableAndOutOfMemoryIsReal) {
  if (registered_device()) GTEST_SKIP() << kNeedsAFreshProcess;
  setenv("TORCHBRIDGE_EMU_MEMORY", "64M", 1);
  setenv("TORCHBRIDGE_EMU_DEVICES", "3", 1);
  const auto backend = create_backend("emu");
  EXPECT_EQ(backend->device_count(), 3);
  EXPECT_EQ(backend->info(0).total_memory_bytes, 64ull << 20);
  const auto options = at::TensorOptions().dtype(at::kByte).device(emu());
  const at::Tensor fits = at::empty({40 << 20}, options);
  EXPECT_THROW(at::empty({40 << 20}, options), c10::OutOfMemoryError);
}

TEST(Sdk, MemoryFractionCapsWhatTheProcessReservesAsCudasDoes) {
  if (registered_device()) GTEST_SKIP() << kNeedsAFreshProcess;
  setenv("TORCHBRIDGE_EMU_MEMORY", "256M", 1);
  setenv("TORCHBRIDGE_EMU_DEVICES", "2", 1);
  const auto options = at::TensorOptions().dtype(at::kByte).device(emu(0));
  EXPECT_EQ(memory_fraction(0), 1.0);
  set_memory_fraction(0.25, 0);  // 64 MiB of 256: room for three 20 MiB segments, not four
  EXPECT_EQ(memory_fraction(0), 0.25);
  EXPECT_EQ(memory_fraction(1), 1.0);
  std::vector<at::Tensor> held;
  for (int i = 0; i < 3; ++i) held.push_back(at::empty({20 << 20}, options));  // a segment each
  const std::string refused = error_of([&] { held.push_back(at::empty({20 << 20}, options)); });
  EXPECT_NE(refused.find("per-process memory fraction 0.25 caps this process at 67108864 bytes"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("62914560 are reserved"), std::string::npos) << refused;
  EXPECT_THROW(at::empty({20 << 20}, options), c10::OutOfMemoryError);
  // The device itself had room, and the other device has no cap.
  EXPECT_NO_THROW(at::empty({100 << 20}, options.device(emu(1))));
  // Freed memory is cached, and the cache is released to make room under the cap.
  held.clear();
  EXPECT_NO_THROW(at::empty({60 << 20}, options));
  set_memory_fraction(1.0, 0);
  EXPECT_NO_THROW(at::empty({200 << 20}, options));

  EXPECT_NE(error_of([] { set_memory_fraction(1.5, 0); }).find("memory fraction 1.5 is invalid: expected a number "
                                                               "from 0 to 1"),
            std::string::npos);
  EXPECT_THROW(set_memory_fraction(-0.1, 0), c10::ValueError);
  EXPECT_THROW(set_memory_fraction(std::nan(""), 0), c10::ValueError);
  EXPECT_NE(error_of([] { set_memory_fraction(0.5, 2); }).find("device index 2 is out of range for 'emu' (2 devices)"),
            std::string::npos);
  EXPECT_THROW(memory_fraction(-1), c10::IndexError);
}

TEST(Sdk, BadRuntimeOptionsAreClearErrors) {
  if (registered_device()) GTEST_SKIP() << kNeedsAFreshProcess;
  setenv("TORCHBRIDGE_EMU_MEMORY", "0", 1);
  const std::string message = error_of([] { load_device("emu"); });
  EXPECT_NE(message.find("failed to start"), std::string::npos) << message;
  EXPECT_NE(message.find("TORCHBRIDGE_EMU_MEMORY='0'"), std::string::npos) << message;
  EXPECT_FALSE(registered_device().has_value());
}

TEST(Sdk, UnknownAndMalformedDeviceNames) {
  const std::string missing = error_of([] { load_device("warpcore"); });
  EXPECT_NE(missing.find("libtorchbridge_device_warpcore.so"), std::string::npos) << missing;
  EXPECT_NE(missing.find("TORCHBRIDGE_DEVICE_PATH"), std::string::npos) << missing;
  // A name must be lower-case letters and underscores, [a-z][a-z_]*: it becomes a file name and
  // torch's backend name, whose parser takes no digits. Each of these breaks that rule in one place.
  for (const std::string name :
       {"../emu", "", "Emu", "1emu", "_emu", "emu-2", "emu ", "em.u", "emü", "emu2", "emu_2"}) {
    const std::string malformed = error_of([&] { load_device(name); });
    EXPECT_NE(malformed.find("invalid device name '" + name + "'"), std::string::npos) << malformed;
  }
  // Underscores after the first letter are allowed: the name passes the check and the search for
  // its library is what fails.
  const std::string allowed = error_of([] { load_device("emu_two"); });
  EXPECT_NE(allowed.find("libtorchbridge_device_emu_two.so"), std::string::npos) << allowed;
}

TEST(Sdk, TheSinglePrivateUse1SlotIsNotTakenTwice) {
  load_device("emu");
  tb_runtime other = {};
  other.struct_size = sizeof(tb_runtime);
  other.abi_version = TB_RUNTIME_ABI_VERSION;
  other.name = "other";
  // A table with NULL entries is rejected naming the first missing entry...
  EXPECT_NE(error_of([&] { register_runtime(&other); }).find("leaves entry status_string NULL"), std::string::npos);
  // ...and a complete, valid one is refused because the slot already holds emu.
  void* library = dlopen(TORCHBRIDGE_EMU_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr);
  const char* error = nullptr;
  const tb_runtime* emu_table = reinterpret_cast<tb_runtime_entry_fn>(dlsym(library, TB_RUNTIME_ENTRY_SYMBOL))(&error);
  ASSERT_NE(emu_table, nullptr) << error;
  tb_runtime renamed = *emu_table;
  renamed.name = "other";
  const std::string message = error_of([&] { register_runtime(&renamed); });
  EXPECT_NE(message.find("single PrivateUse1 slot"), std::string::npos) << message;
  EXPECT_NE(message.find("'emu'"), std::string::npos) << message;
  EXPECT_NO_THROW(load_device("emu"));  // loading the registered device again is a no-op
  EXPECT_EQ(registered_device(), "emu");
}

TEST(Sdk, AbiVersionMismatchIsRejected) {
  tb_runtime future = {};
  future.struct_size = sizeof(tb_runtime);
  future.abi_version = TB_RUNTIME_ABI_VERSION + 1;
  future.name = "future";
  const std::string message = error_of([&] { register_runtime(&future); });
  EXPECT_NE(message.find("ABI version"), std::string::npos) << message;
}

TEST(Sdk, FallbackIsCountedPerOperator) {
  const c10::Device device = emu();
  reset_fallback_counts();
  const at::Tensor x = at::ones({4}, at::TensorOptions().device(device));
  const at::Tensor y = (x * 3).exp();
  EXPECT_EQ(y.device(), device);
  const auto counts = fallback_counts();
  EXPECT_EQ(counts.at("aten::mul.Tensor"), 1);  // the elementwise shortcut counts the operator called
  EXPECT_EQ(counts.at("aten::exp.out"), 1);
  EXPECT_EQ(counts.count("aten::fill_.Scalar"), 0u) << "fill_ is native, not a fallback";
}

TEST(Sdk, StrictModeRaisesInsteadOfFallingBack) {
  const c10::Device device = emu();
  setenv(kStrictEnvVar, "1", 1);
  const at::Tensor x = at::ones({4}, at::TensorOptions().device(device));  // native ops still work
  const std::string message = error_of([&] { x.exp(); });
  unsetenv(kStrictEnvVar);
  EXPECT_NE(message.find("aten::exp"), std::string::npos) << message;
  EXPECT_NE(message.find("TORCHBRIDGE_SDK_STRICT=1"), std::string::npos) << message;
  EXPECT_NO_THROW(x.exp());
}

TEST(Sdk, MixingDevicesIsAnErrorNotASilentHostComputation) {
  const at::Tensor on_emu = at::ones({4}, at::TensorOptions().device(emu()));
  const std::string message = error_of([&] { at::add(on_emu, at::ones({4})); });
  EXPECT_NE(message.find("Expected all tensors to be on the same device"), std::string::npos) << message;
  const at::Tensor on_second = at::ones({4}, at::TensorOptions().device(emu(1)));
  EXPECT_NE(error_of([&] { at::add(on_emu, on_second); }).find("same device"), std::string::npos);
  // A 0-dim CPU tensor is a scalar and allowed, as on CUDA.
  EXPECT_EQ(at::add(on_emu, at::scalar_tensor(2.0)).sum().item<float>(), 12.0f);
}

// torch.accelerator.empty_host_cache() and C++ code asking torch for the device's host allocator
// read at::getHostAllocator(PrivateUse1), which nothing set: a null pointer, SIGSEGV.
TEST(Sdk, PinnedMemoryIsTorchsHostAllocatorForTheDeviceAndCountsWhatItHolds) {
  const c10::Device device = emu();
  at::HostAllocator* allocator = at::getHostAllocator(c10::DeviceType::PrivateUse1);
  ASSERT_NE(allocator, nullptr);
  allocator->reset_accumulated_stats();
  const at::HostStats before = allocator->get_stats();
  at::Tensor pinned = at::ones({1000}).pin_memory(device);  // 4,000 bytes
  ASSERT_TRUE(pinned.is_pinned());
  const at::HostStats held = allocator->get_stats();
  EXPECT_EQ(held.active_bytes.current - before.active_bytes.current, 4000);
  EXPECT_EQ(held.active_requests.current - before.active_requests.current, 1);
  EXPECT_EQ(held.num_host_alloc, 1);
  EXPECT_EQ(held.bucket_allocation[12], 1);  // 4,000 bytes fit the 4,096-byte bucket, as torch's do
  const c10::Stream stream(c10::Stream::DEFAULT, device);
  EXPECT_TRUE(allocator->record_event(pinned.data_ptr(), nullptr, stream));
  const at::Tensor unpinned = at::ones({4});
  EXPECT_FALSE(allocator->record_event(unpinned.data_ptr(), nullptr, stream));
  pinned.reset();  // freed; held from the runtime until the stream passes the recorded use
  c10::impl::VirtualGuardImpl(c10::DeviceType::PrivateUse1).synchronizeStream(stream);
  allocator->empty_cache();
  const at::HostStats after = allocator->get_stats();
  EXPECT_EQ(after.active_bytes.current, before.active_bytes.current);
  EXPECT_EQ(after.allocated_bytes.current, before.allocated_bytes.current);
  EXPECT_EQ(after.num_host_free, 1);
}

TEST(Sdk, GuardedDeviceMemoryIsNotHostReadable) {
  setenv("TORCHBRIDGE_EMU_GUARDED", "1", 1);
  const at::Tensor t = at::ones({1024}, at::TensorOptions().device(emu()));
  EXPECT_FALSE(create_backend("emu")->info(0).features.unified_memory);
  const float* device_pointer = t.data_ptr<float>();
  EXPECT_DEATH({ volatile float v = device_pointer[0]; (void)v; }, "");
}

}  // namespace
}  // namespace torchbridge::sdk

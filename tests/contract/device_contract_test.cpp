// Device behaviour every backend must have: indices and guards, streams and events, exact
// allocator statistics, RNG reproducibility, bit-exact transfers, autocast, serialization.
#include "contract.h"

#include <torchbridge/sdk/device.h>

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace torchbridge::contract {
namespace {

constexpr int64_t kMiB = 1 << 20;

at::Tensor random_bits(at::ScalarType dtype, std::vector<int64_t> shape) {
  // Random bytes reinterpreted as `dtype`: every bit pattern (NaN payloads included) must survive.
  const int64_t bytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor raw = at::randint(0, 256, {bytes}, at::TensorOptions().dtype(at::kByte));
  if (dtype == at::kBool) raw = raw.remainder(2);
  return raw.view(dtype).view(shape);
}

TEST_P(Contract, DeviceCountIndicesAndGuards) {
  const int count = backend().device_count();
  ASSERT_GE(count, 1);
  EXPECT_THROW(backend().device(count), c10::Error);
  if (is_cpu()) return;  // the host has a single device and no device switching
  const c10::DeviceType type = backend().device_type();
  const auto& guard_impl = *c10::impl::getDeviceGuardImpl(type);
  EXPECT_EQ(guard_impl.deviceCount(), count);
  const c10::Device before = guard_impl.getDevice();
  for (int i = 0; i < count; ++i) {
    const c10::DeviceGuard guard(device(i));
    EXPECT_EQ(guard_impl.getDevice().index(), i);
    const at::Tensor t = at::empty({4}, at::TensorOptions().device(type));  // lands on the current device
    EXPECT_EQ(t.device().index(), i);
  }
  EXPECT_EQ(guard_impl.getDevice(), before);  // guards restore the previous device
}

TEST_P(Contract, StreamsOrderWorkAcrossStreamsThroughEvents) {
  if (is_cpu()) GTEST_SKIP() << "the CPU has no streams: its work is synchronous";
  const at::Tensor host = at::arange(4 * kMiB, at::TensorOptions().dtype(at::kInt));
  const c10::Stream producer = backend().new_stream(0), consumer = backend().new_stream(0);
  ASSERT_NE(producer, consumer);
  at::Tensor staged = at::empty_like(host, at::TensorOptions().device(device()));
  at::Tensor result = at::empty_like(staged);
  c10::Event ready(backend().device_type());
  {
    const c10::StreamGuard on_producer(producer);
    staged.copy_(host);
    ready.record(producer);
  }
  ready.block(consumer);  // the consumer may only read `staged` after the producer wrote it
  {
    const c10::StreamGuard on_consumer(consumer);
    result.copy_(staged);
  }
  consumer.synchronize();
  EXPECT_TRUE(bit_equal(result.cpu(), host));
  EXPECT_TRUE(producer.query());
  EXPECT_TRUE(consumer.query());
}

TEST_P(Contract, EventElapsedTimeIsPositiveAndPlausible) {
  if (is_cpu()) GTEST_SKIP() << "the CPU has no events: its work is synchronous";
  const c10::Stream stream = backend().new_stream(0);
  c10::Event start(backend().device_type(), c10::EventFlag::BACKEND_DEFAULT);
  c10::Event stop(backend().device_type(), c10::EventFlag::BACKEND_DEFAULT);
  const at::Tensor host = at::ones({16 * kMiB}, at::TensorOptions().dtype(at::kByte));
  at::Tensor target = at::empty({16 * kMiB}, at::TensorOptions().dtype(at::kByte).device(device()));
  const auto wall_start = std::chrono::steady_clock::now();
  {
    const c10::StreamGuard guard(stream);
    start.record(stream);
    for (int i = 0; i < 4; ++i) target.copy_(host);
    stop.record(stream);
  }
  stop.synchronize();
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start).count();
  EXPECT_TRUE(stop.query());
  const double device_ms = start.elapsedTime(stop);
  EXPECT_GT(device_ms, 0.0);
  EXPECT_LE(device_ms, wall_ms + 1.0) << "device time cannot exceed the host time around it";
}

TEST_P(Contract, AllocatorStatisticsAreExact) {
  if (is_cpu()) GTEST_SKIP() << "the CPU allocator keeps no statistics (the cpu backend reports OS RSS)";
  backend().synchronize(0);
  backend().empty_cache();
  backend().reset_peak_memory_stats(0);
  const MemoryStats base = backend().memory_stats(0);
  ASSERT_TRUE(base.allocated_bytes && base.reserved_bytes && base.peak_allocated_bytes);
  {
    const at::Tensor a = at::empty({kMiB / 4}, at::TensorOptions().dtype(at::kFloat).device(device()));  // 1 MiB
    const at::Tensor b = at::empty({3 * kMiB}, at::TensorOptions().dtype(at::kByte).device(device()));   // 3 MiB
    const MemoryStats during = backend().memory_stats(0);
    EXPECT_EQ(*during.allocated_bytes - *base.allocated_bytes, 4 * kMiB);
    EXPECT_GE(*during.reserved_bytes, *during.allocated_bytes);
    EXPECT_GE(*during.peak_allocated_bytes, *during.allocated_bytes);
    EXPECT_EQ(*during.allocation_count - *base.allocation_count, 2);
  }
  const MemoryStats after = backend().memory_stats(0);
  EXPECT_EQ(*after.allocated_bytes, *base.allocated_bytes);
  EXPECT_EQ(*after.peak_allocated_bytes - *base.allocated_bytes, 4 * kMiB);
  backend().reset_peak_memory_stats(0);
  EXPECT_EQ(*backend().memory_stats(0).peak_allocated_bytes, *after.allocated_bytes);
  EXPECT_GT(*after.reserved_bytes, *base.reserved_bytes);  // the freed blocks stay cached...
  backend().empty_cache();
  const MemoryStats emptied = backend().memory_stats(0);
  EXPECT_EQ(*emptied.reserved_bytes, *base.reserved_bytes);  // ...until emptyCache
  // The device itself must get the memory back, not just the allocator's books. Only an SDK
  // device's free memory is this process's alone: a CUDA GPU's is shared with every other process
  // and the driver, so there only the allocator's books are exact.
  if (base.free_bytes && emptied.free_bytes && backend().device_type() == c10::DeviceType::PrivateUse1) {
    EXPECT_EQ(*emptied.free_bytes, *base.free_bytes) << "device memory was not returned after emptyCache";
  }
}

TEST_P(Contract, AllocatorDoesNotGrowOverTenThousandCycles) {
  if (is_cpu()) GTEST_SKIP() << "the CPU allocator keeps no statistics (the cpu backend reports OS RSS)";
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device());
  { at::empty({1000}, options); at::empty({300000}, options); }  // warm both pools once
  const MemoryStats warm = backend().memory_stats(0);
  for (int i = 0; i < 10000; ++i) {
    const at::Tensor small = at::empty({1 + i % 1000}, options);
    const at::Tensor large = at::empty({300000 + i % 7}, options);
  }
  const MemoryStats after = backend().memory_stats(0);
  EXPECT_EQ(*after.allocated_bytes, *warm.allocated_bytes);
  EXPECT_EQ(*after.reserved_bytes, *warm.reserved_bytes) << "the cache grew while cycling";
  EXPECT_EQ(*after.allocation_count - *warm.allocation_count, 20000);
}

// `bytes` as torch's caching allocators print sizes in their messages: two decimals of the largest
// binary unit that keeps the number above 1 (e.g. "80.00 GiB").
std::string human_size(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (bytes <= 1024) {
    out << bytes << " bytes";
  } else if (bytes <= kMiB) {
    out << static_cast<double>(bytes) / 1024.0 << " KiB";
  } else if (bytes <= 1024 * kMiB) {
    out << static_cast<double>(bytes) / static_cast<double>(kMiB) << " MiB";
  } else {
    out << static_cast<double>(bytes) / static_cast<double>(1024 * kMiB) << " GiB";
  }
  return out.str();
}

TEST_P(Contract, OutOfMemoryIsACatchableErrorThatStatesTheNumbers) {
  if (is_cpu()) GTEST_SKIP() << "exhausting host memory is not a safe test";
  const MemoryStats stats = backend().memory_stats(0);
  ASSERT_TRUE(stats.total_bytes.has_value());
  // More than the device holds, in whole 2 MiB units so no allocator rounds the request it reports.
  const int64_t too_much = (*stats.total_bytes / (2 * kMiB) + 1) * 2 * kMiB;
  try {
    at::empty({too_much}, at::TensorOptions().dtype(at::kByte).device(device()));
    FAIL() << "allocating more than the device holds succeeded";
  } catch (const c10::OutOfMemoryError& e) {
    // The requested size, exactly (SDK devices) or as torch's native allocators print it (CUDA:
    // "Tried to allocate 80.00 GiB"), and what is free and what the cache holds.
    const std::string& message = e.msg();
    const bool states_request = message.find(std::to_string(too_much)) != std::string::npos ||
                                message.find(human_size(too_much)) != std::string::npos;
    EXPECT_TRUE(states_request) << "the message does not state the " << too_much << " bytes requested: " << message;
    EXPECT_NE(message.find("free"), std::string::npos) << message;
    const bool states_cache = message.find("cached") != std::string::npos || message.find("reserved") != std::string::npos;
    EXPECT_TRUE(states_cache) << "the message does not state what the cache holds: " << message;
  }
  EXPECT_EQ(*backend().memory_stats(0).out_of_memory_count, *stats.out_of_memory_count + 1);
  // The device still works afterwards.
  const at::Tensor after = at::ones({8}, at::TensorOptions().device(device()));
  EXPECT_EQ(after.sum().item<float>(), 8.0f);
}

TEST_P(Contract, SdkMemoryFractionCapsWhatTheProcessReserves) {
  if (device().type() != c10::DeviceType::PrivateUse1) {
    GTEST_SKIP() << "the per-process memory fraction is the SDK caching allocator's (CUDA's is torch's own)";
  }
  backend().empty_cache();
  const MemoryStats before = backend().memory_stats(0);
  ASSERT_TRUE(before.total_bytes && before.reserved_bytes);
  // Room for three 20 MiB segments above what the process holds now, not four.
  const int64_t cap = *before.reserved_bytes + 64 * kMiB;
  struct Uncap {
    ~Uncap() { sdk::set_memory_fraction(1.0, 0); }
  } uncap;
  sdk::set_memory_fraction(static_cast<double>(cap) / static_cast<double>(*before.total_bytes), 0);
  const auto options = at::TensorOptions().dtype(at::kByte).device(device());
  std::vector<at::Tensor> held;
  for (int i = 0; i < 3; ++i) held.push_back(at::empty({20 * kMiB}, options));
  try {
    held.push_back(at::empty({20 * kMiB}, options));
    FAIL() << "a fourth 20 MiB segment fit under a cap of " << cap << " bytes";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(e.msg().find("per-process memory fraction"), std::string::npos) << e.msg();
  }
  EXPECT_LE(*backend().memory_stats(0).reserved_bytes, cap);
  sdk::set_memory_fraction(1.0, 0);
  EXPECT_NO_THROW(held.push_back(at::empty({20 * kMiB}, options)));
}

TEST_P(Contract, RandomNumbersAreReproduciblePerDevice) {
  at::Generator generator = at::globalContext().defaultGenerator(device());
  const auto options = at::TensorOptions().device(device());
  generator.set_current_seed(1234);
  const at::Tensor first = at::randn({64}, options).cpu();
  const at::Tensor second = at::randn({64}, options).cpu();
  generator.set_current_seed(1234);
  EXPECT_TRUE(bit_equal(at::randn({64}, options).cpu(), first));
  EXPECT_TRUE(bit_equal(at::randn({64}, options).cpu(), second));
  EXPECT_FALSE(at::equal(first, second));
  // State round trip: restoring a saved state replays the sequence.
  const at::Tensor state = generator.get_state();
  const at::Tensor next = at::rand({32}, options).cpu();
  generator.set_state(state);
  EXPECT_TRUE(bit_equal(at::rand({32}, options).cpu(), next));
  EXPECT_EQ(generator.current_seed(), 1234u);
}

TEST_P(Contract, TransfersAreBitExactForEveryDtype) {
  for (const auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kByte, at::kChar, at::kShort,
                           at::kInt, at::kLong, at::kBool, at::kComplexFloat}) {
    const at::Tensor host = random_bits(dtype, {37, 19});
    const at::Tensor on_device = host.to(device());
    EXPECT_EQ(on_device.device(), device());
    EXPECT_TRUE(bit_equal(on_device.cpu(), host)) << c10::toString(dtype);
    EXPECT_TRUE(bit_equal(on_device.clone().cpu(), host)) << "device-to-device, " << c10::toString(dtype);
  }
}

TEST_P(Contract, TransfersHandleViewsAndLeaveNeighboursIntact) {
  const at::Tensor host = at::randn({6, 8});
  at::Tensor on_device = host.to(device());
  EXPECT_TRUE(bit_equal(on_device.t().cpu(), host.t().contiguous()));
  EXPECT_TRUE(bit_equal(on_device.slice(1, 1, 8, 3).cpu(), host.slice(1, 1, 8, 3).contiguous()));
  // Writing into a strided view must not touch the elements between its elements.
  const at::Tensor column = at::full({6}, 42.0f);
  on_device.select(1, 2).copy_(column);
  at::Tensor expected = host.clone();
  expected.select(1, 2).copy_(column);
  EXPECT_TRUE(bit_equal(on_device.cpu(), expected));
  // dtype conversion on the way in and out
  EXPECT_TRUE(bit_equal(host.to(device(), at::kDouble).cpu(), host.to(at::kDouble)));
}

TEST_P(Contract, TransfersAcrossDevicesAreBitExact) {
  if (backend().device_count() < 2) GTEST_SKIP() << GetParam() << " has a single device";
  const at::Tensor host = random_bits(at::kFloat, {1024, 33});
  const at::Tensor on_first = host.to(device(0));
  const at::Tensor on_second = on_first.to(device(1));
  EXPECT_EQ(on_second.device(), device(1));
  EXPECT_TRUE(bit_equal(on_second.cpu(), host));
}

TEST_P(Contract, PinnedNonBlockingCopiesArriveAfterSynchronize) {
  if (is_cpu()) GTEST_SKIP() << "pinned memory and non_blocking copies concern accelerators";
  const at::Tensor pinned = at::arange(kMiB, at::TensorOptions().dtype(at::kInt)).pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  const at::Tensor on_device = pinned.to(device(), /*non_blocking=*/true);
  backend().synchronize(0);
  EXPECT_TRUE(bit_equal(on_device.cpu(), pinned));
  at::Tensor back = at::empty_like(pinned).pin_memory();
  back.copy_(on_device, /*non_blocking=*/true);
  backend().synchronize(0);
  EXPECT_TRUE(bit_equal(back, pinned));
  // torch's _to_copy gives a non_blocking copy to the host a pinned result, so the copy is queued.
  // An SDK device's must be pinned for that device: torch alone pins it for CUDA wherever the
  // process has CUDA, which the SDK then copies into synchronously (src/sdk/to_copy.cpp).
  const at::Tensor down = on_device.to(at::TensorOptions().device(at::kCPU), /*non_blocking=*/true);
  backend().synchronize(0);
  EXPECT_TRUE(down.is_pinned());
  EXPECT_TRUE(bit_equal(down, pinned));
}

TEST_P(Contract, AutocastPicksTheDocumentedDtypes) {
  const c10::DeviceType type = backend().device_type();
  const at::ScalarType lower = at::autocast::get_autocast_dtype(type);
  at::autocast::set_autocast_enabled(type, true);
  const auto options = at::TensorOptions().device(device());
  const at::Tensor a = at::randn({8, 8}, options), b = at::randn({8, 8}, options);
  const at::Tensor product = at::mm(a, b);                         // lower-precision list
  const at::Tensor probabilities = at::softmax(product, 1);        // fp32 list (set_opt_dtype)
  const at::Tensor promoted = at::addcmul(a, product, b);          // promote list: widest input
  at::autocast::set_autocast_enabled(type, false);
  at::autocast::clear_cache();
  EXPECT_EQ(product.scalar_type(), lower);
  // Accelerators use CUDA's lists (softmax in fp32, addcmul promoted to the widest input); the
  // CPU's own autocast lists differ on both.
  if (!is_cpu()) {
    EXPECT_EQ(probabilities.scalar_type(), at::kFloat);
    EXPECT_EQ(promoted.scalar_type(), at::kFloat);
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat) << "autocast must end when disabled";
}

TEST_P(Contract, SaveAndLoadRoundTrip) {
  const at::Tensor original = at::randn({5, 7}, at::TensorOptions().device(device()));
  std::stringstream buffer;
  torch::save(original, buffer);
  at::Tensor restored;
  torch::load(restored, buffer);
  EXPECT_EQ(restored.device(), original.device()) << "a tensor saved on a device loads back there";
  EXPECT_TRUE(bit_equal(restored.cpu(), original.cpu()));
  buffer.seekg(0);
  at::Tensor on_host;
  torch::load(on_host, buffer, c10::Device(c10::kCPU));  // map_location to the CPU
  EXPECT_TRUE(on_host.is_cpu());
  EXPECT_TRUE(bit_equal(on_host, original.cpu()));
}

INSTANTIATE_TEST_SUITE_P(Backends, Contract, ::testing::ValuesIn(contract_backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace torchbridge::contract

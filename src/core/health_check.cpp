#include <torchbridge/health.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/sum.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace torchbridge {

namespace {

// A pattern where every element differs from its neighbours, so a dropped, shifted or duplicated
// block of a copy shows up in the comparison. Computed in int64 a chunk at a time: for the whole
// tensor at once the temporaries took seven times the checked size on the host (a check of 8 GiB
// had the process killed for memory).
at::Tensor host_pattern(int64_t count) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  at::Tensor pattern = at::empty({count}, at::TensorOptions().dtype(at::kInt));
  for (int64_t first = 0; first < count; first += kChunk) {
    const int64_t end = std::min(count, first + kChunk);
    pattern.slice(0, first, end)
        .copy_(at::arange(first, end, at::TensorOptions().dtype(at::kLong))
                   .mul_(c10::Scalar(int64_t{2654435761}))
                   .remainder_(c10::Scalar(int64_t{1} << 31)));
  }
  return pattern;
}

}  // namespace

HealthCheckResult run_health_check(Backend& backend, int index, int64_t bytes) {
  constexpr auto kElement = static_cast<int64_t>(sizeof(int32_t));
  TORCH_CHECK_VALUE(bytes > 0 && bytes % kElement == 0, "run_health_check: bytes must be a positive multiple of ",
                    kElement, " (the pattern is int32 elements), got ", bytes);
  HealthCheckResult result;
  const auto start = std::chrono::steady_clock::now();
  try {
    const c10::Device device = backend.device(index);
    const int64_t count = bytes / kElement;
    const at::Tensor pattern = host_pattern(count);
    const at::Tensor on_device = pattern.to(device, /*non_blocking=*/false, /*copy=*/true);
    const at::Tensor copied_on_device = on_device.clone();
    backend.synchronize(index);
    const at::Tensor back = copied_on_device.to(c10::Device(c10::kCPU), false, true);
    if (at::equal(back, pattern)) {
      result.passed = true;
      result.detail = "copied " + std::to_string(bytes) + " bytes host->device->device->host, bit-exact";
    } else {
      const int64_t wrong = at::ne(back, pattern).sum().item<int64_t>();
      result.detail = "pattern corrupted: " + std::to_string(wrong) + " of " + std::to_string(count) +
                      " int32 elements differ after the round trip";
    }
  } catch (const std::exception& error) {
    result.detail = error.what();
    if (const auto newline = result.detail.find('\n'); newline != std::string::npos) {
      result.detail.resize(newline);  // drop c10's C++ backtrace from the report
    }
  }
  result.duration_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace torchbridge

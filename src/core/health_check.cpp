#include <torchbridge/health.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/sum.h>

#include <chrono>
#include <exception>
#include <string>

namespace torchbridge {

HealthCheckResult run_health_check(Backend& backend, int index, int64_t bytes) {
  HealthCheckResult result;
  const auto start = std::chrono::steady_clock::now();
  try {
    const c10::Device device = backend.device(index);
    const int64_t count = bytes / static_cast<int64_t>(sizeof(int32_t));
    // A pattern where every element differs from its neighbours, so a dropped, shifted or
    // duplicated block of a copy shows up in the comparison.
    const at::Tensor pattern =
        at::arange(count, at::TensorOptions().dtype(at::kLong))
            .mul(c10::Scalar(int64_t{2654435761}))
            .remainder(c10::Scalar(int64_t{1} << 31))
            .to(at::kInt);
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

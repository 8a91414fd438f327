// `torchbridge bench`'s SDK group: what a device costs per operation and per byte against the CPU.
#include "bench_cases.h"
#include "median_seconds.h"

#include <torchbridge/backend.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

// Mean time of one call, in microseconds: `calls` calls then a synchronize, median of `repeats`.
double per_call_us(int repeats, int calls, const std::function<void()>& body, const std::function<void()>& sync) {
  return median_seconds(repeats, [&] {
           for (int i = 0; i < calls; ++i) body();
           sync();
         }) *
         1e6 / calls;
}

}  // namespace

std::vector<BenchResult> bench_sdk(const std::string& name, const BenchOptions& options) {
  const auto backend = create_backend(name);
  TORCH_CHECK_VALUE(backend->device_type() != c10::kCPU, "the SDK benchmarks compare a device with the CPU; "
                    "name a backend other than cpu (e.g. emu)");
  const bool sdk = BackendRegistry::instance().device_type_of(name) == c10::DeviceType::PrivateUse1;
  const auto goal = [sdk](double ratio) { return sdk ? std::optional<double>(ratio) : std::nullopt; };
  const c10::Device device = backend->device(0);
  const auto sync_device = [&] { backend->synchronize(0); };
  const auto sync_cpu = [] {};
  const int repeats = options.quick ? 3 : 7;
  const auto progress = [&](const std::string& label) {
    if (options.progress) options.progress("sdk " + name + ": " + label);
  };
  const OneIntraOpThread one_thread;  // both sides run the same CPU kernels (emu computes with them)
  std::vector<BenchResult> results;
  const auto add = [&](std::string label, std::string unit, std::string baseline_label, double baseline,
                       double measured, bool higher_is_better, std::optional<double> target) {
    results.push_back({"sdk", name, std::move(label), std::move(unit), std::move(baseline_label), baseline, measured,
                       higher_is_better, target, ""});
  };

  const int calls = options.quick ? 200 : 1000;
  for (const int64_t n : {1, 10, 100, 1000}) {
    const std::string label = "add, " + std::to_string(n) + " elements";
    progress(label);
    const at::Tensor x = at::randn({n}), y = at::randn({n});
    const at::Tensor xd = x.to(device), yd = y.to(device);
    const double cpu = per_call_us(repeats, calls, [&] { at::add(x, y); }, sync_cpu);
    const double dev = per_call_us(repeats, calls, [&] { at::add(xd, yd); }, sync_device);
    add(label, "us", "cpu eager", cpu, dev, false, goal(3.0));
  }

  const int64_t side = options.quick ? 256 : 1024;
  const std::string matmul = "matmul " + std::to_string(side) + "x" + std::to_string(side) + " fp32";
  progress(matmul);
  {
    const at::Tensor a = at::randn({side, side}), b = at::randn({side, side});
    const at::Tensor ad = a.to(device), bd = b.to(device);
    const double cpu = per_call_us(repeats, 3, [&] { at::mm(a, b); }, sync_cpu);
    const double dev = per_call_us(repeats, 3, [&] { at::mm(ad, bd); }, sync_device);
    add(matmul, "us", "cpu eager", cpu, dev, false, goal(1.2));
  }

  const int64_t bytes = (options.quick ? 32LL : 256LL) << 20;
  const std::string size = std::to_string(bytes >> 20) + " MiB";
  progress("copies of " + size);
  {
    const at::Tensor host = at::ones({bytes}, at::kByte);
    at::Tensor host_out = at::zeros({bytes}, at::kByte);
    at::Tensor on_device = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    const auto gbps = [&](double us) { return static_cast<double>(bytes) / (us * 1e3); };
    const double memcpy_gbps = gbps(per_call_us(
        repeats, 1, [&] { std::memcpy(host_out.data_ptr(), host.data_ptr(), bytes); }, sync_cpu));
    // Pinned (page-locked, page-aligned) buffers are how transfers are meant to be made; pageable
    // ones are shown beside them, without a goal.
    const at::Tensor pinned = host.pin_memory();
    at::Tensor pinned_out = host_out.pin_memory();
    const double h2d = gbps(per_call_us(repeats, 1, [&] { on_device.copy_(pinned); }, sync_device));
    const double d2h = gbps(per_call_us(repeats, 1, [&] { pinned_out.copy_(on_device); }, sync_device));
    add("copy " + size + " host->device, pinned", "GB/s", "memcpy", memcpy_gbps, h2d, true, goal(0.8));
    add("copy " + size + " device->host, pinned", "GB/s", "memcpy", memcpy_gbps, d2h, true, goal(0.8));
    const double h2d_pageable = gbps(per_call_us(repeats, 1, [&] { on_device.copy_(host); }, sync_device));
    const double d2h_pageable = gbps(per_call_us(repeats, 1, [&] { host_out.copy_(on_device); }, sync_device));
    add("copy " + size + " host->device, pageable", "GB/s", "memcpy", memcpy_gbps, h2d_pageable, true, std::nullopt);
    add("copy " + size + " device->host, pageable", "GB/s", "memcpy", memcpy_gbps, d2h_pageable, true, std::nullopt);
  }
  return results;
}

}  // namespace torchbridge::cli

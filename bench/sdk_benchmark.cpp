// Device SDK performance on `emu` against the same work on the CPU, measured in one run.
// Prints each result as a ratio to its CPU baseline (lower is better for time ratios, higher for
// the bandwidth ratio) next to the goal from the design:
//   small elementwise ops (1..1000 elements): emu time <= 3x CPU eager
//   1024x1024 float32 matmul:                 emu time <= 1.2x CPU
//   256 MiB host<->device copies:             emu bandwidth >= 0.8x memcpy
// Usage: sdk_benchmark [--quick]   (TORCHBRIDGE_EMU_GUARDED selects the emu memory mode)
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Median over `repeats` of the mean time of `iterations` calls, in microseconds.
double median_us(int repeats, int iterations, const std::function<void()>& body, const std::function<void()>& sync) {
  std::vector<double> samples;
  body();
  sync();  // warm-up
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) body();
    sync();
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

void report(const char* what, double cpu_value, double emu_value, double ratio, const char* goal, bool met) {
  std::printf("%-34s cpu %12.2f   emu %12.2f   ratio %7.2f   goal %-8s %s\n", what, cpu_value, emu_value, ratio, goal,
              std::strcmp(goal, "info") == 0 ? "" : met ? "met" : "NOT met");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int repeats = quick ? 3 : 7;
  auto emu = torchbridge::create_backend("emu");
  const c10::Device device = emu->device(0);
  const auto sync_emu = [&] { emu->synchronize(0); };
  const auto sync_cpu = [] {};
  at::set_num_threads(1);  // both sides run the same single-threaded CPU kernels
  const char* guarded = std::getenv("TORCHBRIDGE_EMU_GUARDED");
  std::printf("TorchBridge SDK benchmark: emu (guarded=%s) vs CPU eager, torch %s, 1 intra-op thread\n",
              guarded ? guarded : "1 (default)", TORCH_VERSION);
  std::printf("times in microseconds; copies in GB/s\n\n");

  int failures = 0;
  for (const int64_t n : {1, 10, 100, 1000}) {
    const at::Tensor x = at::randn({n}), y = at::randn({n});
    const at::Tensor xd = x.to(device), yd = y.to(device);
    const double cpu = median_us(repeats, quick ? 200 : 1000, [&] { at::add(x, y); }, sync_cpu);
    const double dev = median_us(repeats, quick ? 200 : 1000, [&] { at::add(xd, yd); }, sync_emu);
    char label[64];
    std::snprintf(label, sizeof(label), "add, %lld elements", static_cast<long long>(n));
    const double ratio = dev / cpu;
    report(label, cpu, dev, ratio, "<= 3x", ratio <= 3.0);
    failures += ratio > 3.0;
  }

  {
    const at::Tensor a = at::randn({1024, 1024}), b = at::randn({1024, 1024});
    const at::Tensor ad = a.to(device), bd = b.to(device);
    const double cpu = median_us(repeats, 3, [&] { at::mm(a, b); }, sync_cpu);
    const double dev = median_us(repeats, 3, [&] { at::mm(ad, bd); }, sync_emu);
    const double ratio = dev / cpu;
    report("matmul 1024x1024 fp32", cpu, dev, ratio, "<= 1.2x", ratio <= 1.2);
    failures += ratio > 1.2;
  }

  {
    const int64_t bytes = 256LL << 20;
    const at::Tensor host = at::ones({bytes}, at::kByte);
    at::Tensor host_out = at::zeros({bytes}, at::kByte);
    at::Tensor on_device = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    const auto gbps = [&](double us) { return static_cast<double>(bytes) / (us * 1e3); };
    const double memcpy_us = median_us(repeats, 1, [&] { std::memcpy(host_out.data_ptr(), host.data_ptr(), bytes); },
                                       sync_cpu);
    // Pinned (page-locked, page-aligned) host buffers are how device transfers are meant to be
    // measured and used; pageable numbers are printed for information. On the development VM a
    // memcpy whose destination starts mid-page, as torch's pageable tensors do, runs ~4x slower.
    const at::Tensor pinned = host.pin_memory();
    at::Tensor pinned_out = host_out.pin_memory();
    const double h2d_us = median_us(repeats, 1, [&] { on_device.copy_(pinned); }, sync_emu);
    const double d2h_us = median_us(repeats, 1, [&] { pinned_out.copy_(on_device); }, sync_emu);
    const double h2d = gbps(h2d_us) / gbps(memcpy_us), d2h = gbps(d2h_us) / gbps(memcpy_us);
    report("copy 256 MiB host->device, pinned", gbps(memcpy_us), gbps(h2d_us), h2d, ">= 0.8x", h2d >= 0.8);
    report("copy 256 MiB device->host, pinned", gbps(memcpy_us), gbps(d2h_us), d2h, ">= 0.8x", d2h >= 0.8);
    failures += (h2d < 0.8) + (d2h < 0.8);
    const double h2d_pageable_us = median_us(repeats, 1, [&] { on_device.copy_(host); }, sync_emu);
    const double d2h_pageable_us = median_us(repeats, 1, [&] { host_out.copy_(on_device); }, sync_emu);
    report("  (pageable host->device)", gbps(memcpy_us), gbps(h2d_pageable_us), gbps(h2d_pageable_us) / gbps(memcpy_us),
           "info", true);
    report("  (pageable device->host)", gbps(memcpy_us), gbps(d2h_pageable_us), gbps(d2h_pageable_us) / gbps(memcpy_us),
           "info", true);
  }
  std::printf("\n%d goal(s) not met\n", failures);
  return 0;  // a benchmark reports; it does not gate
}

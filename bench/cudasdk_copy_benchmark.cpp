// Host<->device copies through the SDK's CUDA runtime device `cudasdk` (a PyTorch tensor copy_
// on the PrivateUse1 device) against cudaMemcpy on buffers of the same kind and size, measured in
// one run. Goal: >= 0.9x cudaMemcpy's bandwidth, for pinned and for pageable host memory.
// Built only when the CUDA toolkit is found; needs an NVIDIA GPU to run.
// Usage: cudasdk_copy_benchmark [--mib N] [--repeats N]
#include "median_seconds.h"

#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}


}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 256;
  int repeats = 9;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: cudasdk_copy_benchmark [--mib N] [--repeats N]\n");
      return 1;
    }
  }
  const int64_t bytes = mib << 20;
  try {
    const auto backend = torchbridge::create_backend("cudasdk");
    const c10::Device device = backend->device(0);
    const auto sync = [&] { backend->synchronize(0); };

    // cudaMemcpy baseline: its own buffers, so neither side benefits from the other's allocations.
    void* raw_device = nullptr;
    void* raw_pinned = nullptr;
    check(cudaMalloc(&raw_device, bytes), "cudaMalloc");
    check(cudaMallocHost(&raw_pinned, bytes), "cudaMallocHost");
    std::vector<uint8_t> raw_pageable(bytes, 1);
    std::memset(raw_pinned, 1, bytes);

    const auto options = at::TensorOptions().dtype(at::kByte);
    at::Tensor on_device = at::empty({bytes}, options.device(device));
    // pin_memory() pins for the process's accelerator, cudasdk: its runtime's host_malloc. (ATen's
    // pinned_memory(true) would take CUDA's pinned allocator, since the process has CUDA.)
    at::Tensor pinned = at::ones({bytes}, options).pin_memory();
    at::Tensor pageable = at::ones({bytes}, options);

    std::printf("cudasdk_copy_benchmark: %lld MiB, median of %d, cudasdk vs cudaMemcpy\n", (long long)mib, repeats);
    bool all_met = true;
    const auto report = [&](const char* what, double ours, double baseline) {
      const double ratio = baseline / ours;  // bandwidth ratio
      all_met = all_met && ratio >= 0.9;
      std::printf("  %-22s cudasdk %7.2f GB/s   cudaMemcpy %7.2f GB/s   ratio %.2fx   goal >= 0.9x   %s\n", what,
                  bytes / ours / 1e9, bytes / baseline / 1e9, ratio, ratio >= 0.9 ? "met" : "NOT met");
    };
    report("host->device, pinned",
           median_seconds(repeats, [&] { on_device.copy_(pinned); sync(); }),
           median_seconds(repeats, [&] { check(cudaMemcpy(raw_device, raw_pinned, bytes, cudaMemcpyHostToDevice), "H2D"); }));
    report("device->host, pinned",
           median_seconds(repeats, [&] { pinned.copy_(on_device); sync(); }),
           median_seconds(repeats, [&] { check(cudaMemcpy(raw_pinned, raw_device, bytes, cudaMemcpyDeviceToHost), "D2H"); }));
    report("host->device, pageable",
           median_seconds(repeats, [&] { on_device.copy_(pageable); sync(); }),
           median_seconds(repeats, [&] {
             check(cudaMemcpy(raw_device, raw_pageable.data(), bytes, cudaMemcpyHostToDevice), "H2D");
           }));
    report("device->host, pageable",
           median_seconds(repeats, [&] { pageable.copy_(on_device); sync(); }),
           median_seconds(repeats, [&] {
             check(cudaMemcpy(raw_pageable.data(), raw_device, bytes, cudaMemcpyDeviceToHost), "D2H");
           }));
    cudaFree(raw_device);
    cudaFreeHost(raw_pinned);
    std::printf("copies through cudasdk vs cudaMemcpy: goal >= 0.9x   %s\n", all_met ? "met" : "NOT met");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudasdk_copy_benchmark: %s\n", e.what());
    return 1;
  }
}

// Optimizer-state offload against the same optimizer on the device, in one run on one device:
//   device memory   what the first step adds on the device (the optimizer's state; the caching
//                   allocator's count), and the difference, which should equal the state's size
//   step time       forward + backward + optimizer step, median of REPEATS
// The model: LAYERS x Linear(WIDTH, WIDTH) with GELU, AdamW. Issue 15 asks for the memory saved and
// the step time; the host step runs on the CPU, so its time depends on the host's cores.
//   optimizer_offload_benchmark [BACKEND=emu] [LAYERS=8] [WIDTH=1024] [BATCH=64] [REPEATS=5]
#include "median_seconds.h"

#include <torchbridge/backend.h>
#include <torchbridge/memory/offloaded_optimizer.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace torchbridge;
  const std::string backend_name = argc > 1 ? argv[1] : "emu";
  const int64_t layers = argc > 2 ? std::stoll(argv[2]) : 8;
  const int64_t width = argc > 3 ? std::stoll(argv[3]) : 1024;
  const int64_t batch = argc > 4 ? std::stoll(argv[4]) : 64;
  const int repeats = argc > 5 ? std::stoi(argv[5]) : 5;
  const std::shared_ptr<Backend> backend = create_backend(backend_name);
  const c10::Device device = backend->device(0);
  auto make_optimizer = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  };

  struct Result {
    double step_ms;
    int64_t first_step_device_bytes;
    int64_t parameter_bytes;
  };
  auto run = [&](bool offload) {
    at::manual_seed(0);
    torch::nn::Sequential model;
    for (int64_t i = 0; i < layers; ++i) {
      model->push_back(torch::nn::Linear(width, width));
      model->push_back(torch::nn::GELU());
    }
    model->to(device);
    int64_t parameter_bytes = 0;
    for (const auto& p : model->parameters()) parameter_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    std::unique_ptr<torch::optim::Optimizer> on_device;
    std::unique_ptr<memory::OffloadedOptimizer> offloaded;
    if (offload) {
      offloaded = std::make_unique<memory::OffloadedOptimizer>(model->parameters(), make_optimizer);
    } else {
      on_device = make_optimizer(model->parameters());
    }
    const at::Tensor x = at::randn({batch, width}, at::TensorOptions().device(device));
    auto step = [&] {
      model->forward(x).pow(2).mean().backward();
      if (offload) {
        offloaded->step();
        offloaded->zero_grad();
      } else {
        on_device->step();
        on_device->zero_grad();
      }
      backend->synchronize(0);
    };
    const int64_t before = backend->memory_stats(0).allocated_bytes.value_or(0);
    step();  // the first step creates the optimizer state
    const int64_t after = backend->memory_stats(0).allocated_bytes.value_or(0);
    return Result{1e3 * median_seconds(repeats, step), after - before, parameter_bytes};
  };

  const Result on_device = run(false);
  const Result offloaded = run(true);
  const double mib = 1 << 20;
  std::printf("{\"backend\": \"%s\", \"layers\": %lld, \"width\": %lld, \"parameters_mib\": %.1f, "
              "\"device_state_mib_on_device\": %.1f, \"device_state_mib_offloaded\": %.1f, "
              "\"device_memory_saved_mib\": %.1f, \"saved_over_adamw_state\": %.3f, "
              "\"step_ms_on_device\": %.2f, \"step_ms_offloaded\": %.2f, \"step_time_ratio\": %.3f}\n",
              backend_name.c_str(), static_cast<long long>(layers), static_cast<long long>(width),
              static_cast<double>(on_device.parameter_bytes) / mib,
              static_cast<double>(on_device.first_step_device_bytes) / mib,
              static_cast<double>(offloaded.first_step_device_bytes) / mib,
              static_cast<double>(on_device.first_step_device_bytes - offloaded.first_step_device_bytes) / mib,
              static_cast<double>(on_device.first_step_device_bytes - offloaded.first_step_device_bytes) /
                  static_cast<double>(2 * on_device.parameter_bytes),
              on_device.step_ms, offloaded.step_ms, offloaded.step_ms / on_device.step_ms);
  return 0;
}

// A training step through TorchBridge's backend layer against the same step written in raw
// LibTorch, measured in one run. Goal: <= 1.01x (the HAL adds nothing to a step).
//   raw LibTorch: module.to(torch::Device), the loop, the device synchronised through c10's
//                 registered guard (what torch.accelerator.synchronize does);
//   TorchBridge:  create_backend(NAME), Backend::prepare_model(module, O0), the same loop,
//                 Backend::synchronize().
// Both train identical copies of an MLP with Adam on the same batch; trials alternate which side
// goes first, and the ratio is the median over trials of (HAL time / raw time).
// Usage: training_step_benchmark [--backend NAME] [--steps N] [--trials N]
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

torch::nn::Sequential make_mlp(int64_t width) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(width, 4 * width), torch::nn::GELU(),
                               torch::nn::Linear(4 * width, width));
}

// `steps` Adam steps of `model` on (x, y); returns seconds, synchronised by `sync`.
double train(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y, int steps,
             const std::function<void()>& sync) {
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-4));
  const auto step = [&] {
    optimizer.zero_grad();
    at::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  };
  step();  // warm-up: kernels selected, workspaces allocated, optimizer state created
  sync();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  sync();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = torchbridge::detect_best_backend();
  int steps = 0, trials = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      name = argv[++i];
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--trials") == 0 && i + 1 < argc) {
      trials = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: training_step_benchmark [--backend NAME] [--steps N] [--trials N]\n");
      return 1;
    }
  }
  const auto backend = torchbridge::create_backend(name);
  const c10::Device device = backend->device(0);
  const bool host_kernels = device.is_cpu() || device.type() == c10::DeviceType::PrivateUse1;
  // A step the device needs some milliseconds for: larger on a GPU, small where the CPU computes.
  const int64_t width = host_kernels ? 256 : 2048, batch = host_kernels ? 32 : 256;
  if (steps == 0) steps = host_kernels ? 20 : 100;
  if (host_kernels) at::set_num_threads(1);  // timings independent of the machine's other cores

  const at::Tensor x = at::randn({batch, width}).to(device), y = at::randn({batch, width}).to(device);
  const auto* guard = c10::impl::getDeviceGuardImpl(device.type());
  const auto raw_sync = [&] { guard->synchronizeDevice(device.index() < 0 ? 0 : device.index()); };
  const auto hal_sync = [&] { backend->synchronize(0); };

  std::printf("training_step_benchmark: %s (%s), MLP %lld-%lld-%lld, batch %lld, %d Adam steps per trial, "
              "torch %s\n", name.c_str(), device.str().c_str(), (long long)width, (long long)(4 * width),
              (long long)width, (long long)batch, steps, TORCH_VERSION);
  std::vector<double> ratios, raw_times, hal_times;
  for (int trial = 0; trial < trials; ++trial) {
    double raw = 0, hal = 0;
    for (int side = 0; side < 2; ++side) {
      const bool hal_side = (side == 0) == (trial % 2 == 0);  // alternate who goes first
      torch::nn::Sequential model = make_mlp(width);
      if (hal_side) {
        backend->prepare_model(*model, torchbridge::OptLevel::O0);
        hal = train(model, x, y, steps, hal_sync);
      } else {
        model->to(device);
        raw = train(model, x, y, steps, raw_sync);
      }
    }
    ratios.push_back(hal / raw);
    raw_times.push_back(raw / steps);
    hal_times.push_back(hal / steps);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double ratio = median(ratios);
  std::printf("  raw LibTorch  %9.3f ms/step (median of %d trials)\n", median(raw_times) * 1e3, trials);
  std::printf("  TorchBridge   %9.3f ms/step\n", median(hal_times) * 1e3);
  std::printf("training step through the HAL: %.3fx raw LibTorch   goal <= 1.01x   %s\n", ratio,
              ratio <= 1.01 ? "met" : "NOT met");
  return 0;
}

// The C++ half of bench/grad_scaler_benchmark.py: what torchbridge::amp::GradScaler adds around
// an optimizer step (scale + unscale_ + step + update) on a model of TENSORS parameter tensors of
// SIZE floats, as the median time per iteration with the scaler minus the median without it.
// Prints one JSON line. Gradients are set once; init_scale 1 and a growth interval longer than the
// run keep their values (and so the arithmetic's speed) constant across iterations.
//   grad_scaler_benchmark TENSORS SIZE ITERATIONS REPEATS
#include "median_seconds.h"

#include <torchbridge/amp/grad_scaler.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s TENSORS SIZE ITERATIONS REPEATS\n", argv[0]);
    return 2;
  }
  const int tensors = std::stoi(argv[1]), iterations = std::stoi(argv[3]), repeats = std::stoi(argv[4]);
  const int64_t size = std::stoll(argv[2]);
  at::set_num_threads(1);
  at::manual_seed(0);
  std::vector<at::Tensor> params;
  for (int i = 0; i < tensors; ++i) {
    params.push_back(at::randn({size}).set_requires_grad(true));
    params.back().mutable_grad() = at::randn({size});
  }
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(1e-6));
  torchbridge::amp::GradScaler scaler({.init_scale = 1.0, .growth_interval = 1'000'000'000});
  const at::Tensor loss = at::randn({});

  const double plain = median_seconds(repeats, [&] {
    for (int i = 0; i < iterations; ++i) optimizer.step();
  });
  const double scaled = median_seconds(repeats, [&] {
    for (int i = 0; i < iterations; ++i) {
      const at::Tensor scaled_loss = scaler.scale(loss);
      scaler.unscale_(optimizer);
      scaler.step(optimizer);
      scaler.update();
    }
  });
  std::printf("{\"plain_step_us\": %.3f, \"scaled_step_us\": %.3f, \"overhead_us\": %.3f}\n",
              plain / iterations * 1e6, scaled / iterations * 1e6, (scaled - plain) / iterations * 1e6);
  return 0;
}

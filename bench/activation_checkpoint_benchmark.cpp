// Activation checkpointing against none on a stack of transformer encoder layers (torch::nn's,
// the built-in transformer's block scaled up), one training step = forward + backward, measured in
// the same run on the same device:
//   peak activation memory  the caching allocator's peak during the step minus what was allocated
//                           before it and minus the gradients (SDK devices and CUDA; the CPU has
//                           no allocator statistics, so its line reports time only)
//   step time               median of REPEATS steps, with the floor of any recomputing scheme
//                           (step + the forward time of the recomputed blocks, measured here too)
// for checkpointing every block (CheckpointedSequential(stack, 1)) and every 2 blocks. Issue 15's
// goals: peak activation memory <= 0.4x, step time <= 1.35x.
// Prints one JSON line per mode with the figures and the ratios against no checkpointing.
//   activation_checkpoint_benchmark [BACKEND=cpu] [LAYERS=12] [D_MODEL=256] [SEQ=128] [BATCH=8] [REPEATS=5]
#include "median_seconds.h"

#include <torchbridge/backend.h>
#include <torchbridge/memory/checkpoint_sequential.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/transformerlayer.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace {

struct Measurement {
  double step_ms;
  std::optional<int64_t> activation_peak_bytes;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace torchbridge;
  const std::string backend_name = argc > 1 ? argv[1] : "cpu";
  const int64_t layers = argc > 2 ? std::stoll(argv[2]) : 12;
  const int64_t d_model = argc > 3 ? std::stoll(argv[3]) : 256;
  const int64_t seq = argc > 4 ? std::stoll(argv[4]) : 128;
  const int64_t batch = argc > 5 ? std::stoll(argv[5]) : 8;
  const int repeats = argc > 6 ? std::stoi(argv[6]) : 5;
  const std::shared_ptr<Backend> backend = create_backend(backend_name);
  const c10::Device device = backend->device(0);

  at::manual_seed(0);
  torch::nn::Sequential stack;
  for (int64_t i = 0; i < layers; ++i) {
    stack->push_back(torch::nn::TransformerEncoderLayer(
        torch::nn::TransformerEncoderLayerOptions(d_model, 4).dim_feedforward(4 * d_model).dropout(0.1)));
  }
  stack->to(device);
  stack->train();
  int64_t gradient_bytes = 0;
  for (const auto& p : stack->parameters()) gradient_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  const at::Tensor input = at::randn({seq, batch, d_model}, at::TensorOptions().device(device));

  auto measure = [&](const std::function<at::Tensor(const at::Tensor&)>& forward) {
    auto step = [&] {
      forward(input).pow(2).mean().backward();
      backend->synchronize(0);
    };
    auto clear_gradients = [&] {
      for (auto& p : stack->parameters()) p.mutable_grad() = at::Tensor();
    };
    Measurement m{1e3 * median_seconds(repeats, [&] {
                    clear_gradients();
                    step();
                  }),
                  std::nullopt};
    clear_gradients();
    const MemoryStats before = backend->memory_stats(0);
    if (!device.is_cpu() && before.allocated_bytes && before.peak_allocated_bytes) {
      backend->reset_peak_memory_stats(0);
      step();
      m.activation_peak_bytes = *backend->memory_stats(0).peak_allocated_bytes - *before.allocated_bytes -
                                gradient_bytes;
      clear_gradients();
    }
    return m;
  };

  const Measurement none = measure([&](const at::Tensor& x) { return stack->forward(x); });
  // The floor any recomputing scheme has: the step plus one more forward pass over the blocks it
  // recomputes (all but the last group), from the forward pass's own time in this run.
  const double forward_ms = 1e3 * median_seconds(repeats, [&] {
    (void)stack->forward(input);
    backend->synchronize(0);
  });
  auto report = [&](const std::string& mode, const Measurement& m, std::optional<double> floor_ratio) {
    std::printf("{\"backend\": \"%s\", \"layers\": %lld, \"d_model\": %lld, \"seq\": %lld, \"batch\": %lld, "
                "\"mode\": \"%s\", \"step_ms\": %.2f, \"step_time_ratio\": %.3f",
                backend_name.c_str(), static_cast<long long>(layers), static_cast<long long>(d_model),
                static_cast<long long>(seq), static_cast<long long>(batch), mode.c_str(), m.step_ms,
                m.step_ms / none.step_ms);
    if (floor_ratio) std::printf(", \"recompute_floor_ratio\": %.3f", *floor_ratio);
    if (m.activation_peak_bytes && none.activation_peak_bytes) {
      std::printf(", \"activation_peak_mib\": %.1f, \"activation_peak_ratio\": %.3f",
                  static_cast<double>(*m.activation_peak_bytes) / (1 << 20),
                  static_cast<double>(*m.activation_peak_bytes) / static_cast<double>(*none.activation_peak_bytes));
    }
    std::printf("}\n");
    std::fflush(stdout);
  };
  report("none", none, std::nullopt);
  for (int64_t blocks : {1, 2}) {
    memory::CheckpointedSequential checkpointed(stack, blocks);
    const int64_t recomputed = (layers - 1) / blocks * blocks;  // every group but the last
    const double floor_ms = none.step_ms + forward_ms * static_cast<double>(recomputed) / static_cast<double>(layers);
    report("checkpoint every " + std::to_string(blocks) + " block" + (blocks > 1 ? "s" : ""),
           measure([&](const at::Tensor& x) { return checkpointed->forward(x); }), floor_ms / none.step_ms);
  }
  return 0;
}

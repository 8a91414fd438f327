// Data parallel's cost and its communication overlap, run as every rank of a torchrun job:
//   torchrun --nproc-per-node 2 --no-python build/bin/distributed_benchmark [LAYERS WIDTH BATCH REPEATS [DEVICE]]
// DEVICE: cpu (default; Gloo), an SDK device (Gloo through host memory), or cuda (NCCL, each rank
// on the GPU of its LOCAL_RANK; on one GPU, a world of one gives DataParallel's own overhead).
// One model (LAYERS x Linear(WIDTH, WIDTH) with ReLU), one step = forward + backward on this
// rank's BATCH rows, median of REPEATS, in one run:
//   local        no communication at all (the floor)
//   after        DataParallel with one bucket holding every gradient: the all-reduce can start
//                only when backward has produced the last one (all-reduce after backward)
//   overlapped   DataParallel's default buckets (1 MiB first, then 25 MiB), and 4 MiB ones: each
//                bucket's all-reduce starts while backward computes the rest
//   views        the default buckets with gradients as bucket views, gradients zeroed in place
//                between steps (against `local` zeroing in place too): no copies of the gradients
//                into and out of the buckets
// and the all-reduce itself at a few sizes, for the alpha-beta model of README's scaling section.
// Rank 0 prints; ratios are against `local` of the same run.
#include "median_seconds.h"

#include <torchbridge/distributed/data_parallel.h>
#include <torchbridge/distributed/process_group.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using torchbridge::distributed::DataParallel;
using torchbridge::distributed::DataParallelOptions;
using torchbridge::distributed::ProcessGroup;

torch::nn::Sequential make_model(int64_t layers, int64_t width) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

// Every rank's median, and the slowest of them: a data-parallel step is as slow as its slowest rank.
double slowest_rank(ProcessGroup& group, double seconds) {
  double slowest = 0;
  for (const auto& each : group.all_gather(at::full({1}, seconds, at::kDouble))) {
    slowest = std::max(slowest, each.item<double>());
  }
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t layers = argc > 1 ? torchbridge::parse_integer(argv[1], "LAYERS", 1, 1000) : 8;
    const int64_t width = argc > 2 ? torchbridge::parse_integer(argv[2], "WIDTH", 1, 16384) : 1024;
    const int64_t batch = argc > 3 ? torchbridge::parse_integer(argv[3], "BATCH", 1, 1 << 20) : 64;
    const int repeats = argc > 4 ? static_cast<int>(torchbridge::parse_integer(argv[4], "REPEATS", 1, 1000)) : 11;
    const std::string device_name = argc > 5 ? argv[5] : "cpu";
    torchbridge::distributed::InitOptions init;
    init.device = device_name;
    const auto group = torchbridge::distributed::init(init);
    const OneIntraOpThread one_thread;  // each rank one core: ranks share this machine's cores
    const auto backend = torchbridge::create_backend(device_name);
    const c10::Device device = torchbridge::distributed::rank_device(*group, *backend);

    auto model = make_model(layers, width);
    model->to(device);
    int64_t parameter_bytes = 0;
    for (const auto& p : model->parameters()) parameter_bytes += static_cast<int64_t>(p.nbytes());
    torch::manual_seed(1 + group->rank());
    const at::Tensor x = at::randn({batch, width}).to(device);

    // A step ends when the device has finished it (accelerators run asynchronously). Gradients
    // are reset before each (torch's zero_grad default), or zeroed in place (kept).
    bool keep_gradients = false;
    const auto step = [&](const std::function<void(const at::Tensor&)>& backward) {
      for (auto& p : model->parameters()) {
        if (keep_gradients && p.grad().defined()) {
          p.mutable_grad().zero_();
        } else {
          p.mutable_grad().reset();
        }
      }
      backward(model->forward(x).square().mean());
      backend->synchronize(device.has_index() ? device.index() : 0);
    };
    const auto plain_backward = [](const at::Tensor& loss) { loss.backward(); };
    const double local = median_seconds(repeats, [&] { step(plain_backward); });

    // One DataParallel at a time: each registers hooks on the same parameters.
    double after_backward = 0, bucketed = 0;
    {
      DataParallelOptions one_bucket;
      one_bucket.bucket_bytes = one_bucket.first_bucket_bytes = parameter_bytes + 1;
      DataParallel after(*model, group, one_bucket);
      after_backward = median_seconds(repeats, [&] { step([&](const at::Tensor& loss) { after.backward(loss); }); });
    }
    {
      DataParallel overlapped(*model, group);
      bucketed = median_seconds(repeats, [&] { step([&](const at::Tensor& loss) { overlapped.backward(loss); }); });
    }
    double small_buckets = 0;
    {
      DataParallelOptions four_mib;
      four_mib.bucket_bytes = 4 << 20;
      DataParallel overlapped(*model, group, four_mib);
      small_buckets =
          median_seconds(repeats, [&] { step([&](const at::Tensor& loss) { overlapped.backward(loss); }); });
    }

    keep_gradients = true;
    const double local_kept = median_seconds(repeats, [&] { step(plain_backward); });
    double views = 0;
    {
      for (auto& p : model->parameters()) p.mutable_grad().reset();  // the views are made at the first step
      DataParallelOptions as_views;
      as_views.gradient_as_bucket_view = true;
      DataParallel viewed(*model, group, as_views);
      views = median_seconds(repeats, [&] { step([&](const at::Tensor& loss) { viewed.backward(loss); }); });
    }
    keep_gradients = false;

    const double t_local = slowest_rank(*group, local), t_after = slowest_rank(*group, after_backward),
                 t_bucketed = slowest_rank(*group, bucketed), t_small = slowest_rank(*group, small_buckets),
                 t_local_kept = slowest_rank(*group, local_kept), t_views = slowest_rank(*group, views);

    // The all-reduce alone, for the alpha-beta model: time(n bytes) = alpha + n * beta_effective.
    std::vector<std::pair<int64_t, double>> all_reduce;
    // (On the CPU through Gloo: the host staging and the CPU's figures; NCCL's own are its tests'.)
    for (const int64_t bytes : {int64_t{4}, int64_t{64} << 10, int64_t{4} << 20, parameter_bytes}) {
      at::Tensor buffer = at::ones({bytes / 4}, at::kFloat);
      all_reduce.emplace_back(bytes, slowest_rank(*group, median_seconds(repeats, [&] { group->all_reduce_sum(buffer); })));
    }

    if (group->rank() == 0) {
      std::printf("distributed_benchmark: %d ranks on %s, gradients over %s, %lld x Linear(%lld, %lld) = %.1f MiB "
                  "of parameters, batch %lld per rank, median of %d (slowest rank)\n",
                  group->world_size(), device.str().c_str(),
                  device.is_cuda() ? "NCCL" : (device.is_cpu() ? "Gloo" : "Gloo through host memory"),
                  static_cast<long long>(layers), static_cast<long long>(width),
                  static_cast<long long>(width), parameter_bytes / 1048576.0, static_cast<long long>(batch), repeats);
      std::printf("%-46s %10s %8s\n", "step (forward + backward)", "ms", "ratio");
      std::printf("%-46s %10.2f %8.3f\n", "local: no communication", t_local * 1e3, 1.0);
      std::printf("%-46s %10.2f %8.3f\n", "DataParallel, all-reduce after backward", t_after * 1e3, t_after / t_local);
      std::printf("%-46s %10.2f %8.3f\n", "DataParallel, buckets overlapped (1 + 25 MiB)", t_bucketed * 1e3,
                  t_bucketed / t_local);
      std::printf("%-46s %10.2f %8.3f\n", "DataParallel, buckets overlapped (1 + 4 MiB)", t_small * 1e3,
                  t_small / t_local);
      std::printf("gradients zeroed in place between steps instead of reset:\n");
      std::printf("%-46s %10.2f %8.3f\n", "local: no communication", t_local_kept * 1e3, 1.0);
      std::printf("%-46s %10.2f %8.3f\n", "DataParallel, gradients as bucket views", t_views * 1e3,
                  t_views / t_local_kept);
      std::printf("DataParallel's overhead with gradients as bucket views: %.3fx (goal <= 1.02x for a world of one "
                  "on a GPU with NCCL)\n", t_views / t_local_kept);
      const auto hidden = [&](double overlapped) {
        return t_after - t_local > 0 ? 100 * (t_after - overlapped) / (t_after - t_local) : 0.0;
      };
      std::printf("communication cost hidden by overlap, of the after-backward cost: %.0f%% (25 MiB buckets), "
                  "%.0f%% (4 MiB)\n", hidden(t_bucketed), hidden(t_small));
      std::printf("%-20s %12s %14s\n", "all-reduce bytes", "ms", "GB/s (n/t)");
      for (const auto& [bytes, seconds] : all_reduce) {
        std::printf("%-20lld %12.3f %14.3f\n", static_cast<long long>(bytes), seconds * 1e3, bytes / seconds / 1e9);
      }
    }
    group->barrier();
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "distributed_benchmark: %s\n", e.msg().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_benchmark: %s\n", e.what());
    return 1;
  }
}

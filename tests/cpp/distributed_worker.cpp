// One rank of a torchrun job (CTest distributed.torchrun_*): joins the group from torchrun's
// environment, runs each collective with values that depend on the rank, then trains with
// DataParallel on this rank's share of a batch and compares with training on the whole batch in
// one process; exits non-zero naming the first disagreement.
#include <torchbridge/distributed/data_parallel.h>
#include <torchbridge/distributed/pipeline_parallel.h>
#include <torchbridge/distributed/process_group.h>
#include <torchbridge/distributed/tensor_parallel.h>
#include <torchbridge/distributed/zero_optimizer.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + " disagrees with the expected value");
}

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  model->to(at::kDouble);  // float64: the only differences left are summation order's
  return model;
}

at::Tensor gradient_checksum(const torch::nn::Module& model) {
  at::Tensor sum = at::zeros({1}, at::kDouble);
  for (const auto& p : model.parameters()) sum += p.grad().sum();
  return sum;
}

double max_difference(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  return worst;
}

// Each rank trains on its share of a 24-row batch; the reference trains alone on all 24 rows
// from rank 0's initial weights. Averaged gradients of equal shares are the whole batch's
// gradient, so the parameters must agree to summation order. Two steps accumulate two
// micro-batches under no_sync() (their gradient is twice the whole batch's).
double data_parallel_against_one_process(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  const int rank = group->rank(), world = group->world_size();
  constexpr int64_t kBatch = 24;
  torch::manual_seed(7);  // the same data on every rank
  const at::Tensor inputs = at::randn({kBatch, 8}, at::kDouble), targets = at::randn({kBatch, 4}, at::kDouble);
  auto model = make_model(100 + rank);  // each rank starts different: DataParallel takes rank 0's
  auto reference = make_model(100);
  torchbridge::distributed::DataParallel parallel(*model, group);
  expect(max_difference(*model, *reference) == 0, "DataParallel's initial broadcast");
  torch::optim::SGD optimizer(model->parameters(), 0.1), reference_optimizer(reference->parameters(), 0.1);
  const int64_t share = kBatch / world;
  const at::Tensor x = inputs.narrow(0, rank * share, share), y = targets.narrow(0, rank * share, share);
  namespace F = torch::nn::functional;
  for (int step = 0; step < 6; ++step) {
    optimizer.zero_grad();
    const bool accumulate = step >= 4;
    if (accumulate) {
      const int64_t half = share / 2;
      {
        auto local = parallel.no_sync();
        parallel.backward(F::mse_loss(model->forward(x.narrow(0, 0, half)), y.narrow(0, 0, half)));
      }
      // Inside no_sync the gradients stayed local: ranks saw different rows, so they differ.
      if (world > 1) {
        const at::Tensor mine = gradient_checksum(*model);
        int same = 0;
        for (const auto& other : group->all_gather(mine)) same += at::equal(other, mine) ? 1 : 0;
        expect(same == 1, "no_sync (gradients were exchanged inside it)");
      }
      parallel.backward(F::mse_loss(model->forward(x.narrow(0, half, half)), y.narrow(0, half, half)));
    } else {
      parallel.backward(F::mse_loss(model->forward(x), y));
    }
    optimizer.step();
    reference_optimizer.zero_grad();
    (F::mse_loss(reference->forward(inputs), targets) * (accumulate ? 2.0 : 1.0)).backward();
    reference_optimizer.step();
  }
  // Every rank must end with the same parameters: compare checksums across ranks.
  at::Tensor checksum = at::zeros({1}, at::kDouble);
  for (const auto& p : model->parameters()) checksum += p.detach().sum() + (p.detach() * p.detach()).sum();
  for (const auto& other : group->all_gather(checksum)) {
    expect(at::equal(other, checksum), "the parameters' checksum across ranks");
  }
  return max_difference(*model, *reference);
}

// A model with a layer no rank uses in this step's forward pass: with find_unused_parameters the
// reducer marks its parameters ready instead of waiting for gradients that never come, the used
// layer trains as one process on the whole batch does, and the unused one stays as it was.
struct WithAnUnusedLayer : torch::nn::Module {
  WithAnUnusedLayer() {
    used = register_module("used", torch::nn::Linear(8, 4));
    unused = register_module("unused", torch::nn::Linear(8, 4));
    to(at::kDouble);
  }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};

double unused_parameters_against_one_process(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  const int rank = group->rank(), world = group->world_size();
  torch::manual_seed(11);
  WithAnUnusedLayer model;
  torch::manual_seed(11);
  WithAnUnusedLayer reference;
  const at::Tensor unused_before = model.unused->weight.detach().clone();
  torchbridge::distributed::DataParallelOptions options;
  options.find_unused_parameters = true;
  torchbridge::distributed::DataParallel parallel(model, group, options);
  torch::optim::SGD optimizer(model.parameters(), 0.1), reference_optimizer(reference.parameters(), 0.1);
  const at::Tensor inputs = at::randn({24, 8}, at::kDouble), targets = at::randn({24, 4}, at::kDouble);
  const int64_t share = 24 / world;
  namespace F = torch::nn::functional;
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    parallel.backward(F::mse_loss(model.used->forward(inputs.narrow(0, rank * share, share)),
                                  targets.narrow(0, rank * share, share)));
    optimizer.step();
    reference_optimizer.zero_grad();
    F::mse_loss(reference.used->forward(inputs), targets).backward();
    reference_optimizer.step();
  }
  expect(at::equal(model.unused->weight.detach(), unused_before), "the unused layer left as it was");
  return std::max((model.used->weight - reference.used->weight).abs().max().item<double>(),
                  (model.used->bias - reference.used->bias).abs().max().item<double>());
}

// ZeRO-1 against plain data parallel, both from rank 0's weights on the same shares: Adam steps
// each parameter on its own, so the parameters must be bit-identical; the state each rank holds
// must add up to plain Adam's, each rank about 1/world of it (8 equal layers: the shards balance).
void zero_one_against_plain_data_parallel(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  using torchbridge::distributed::DataParallel;
  using torchbridge::distributed::ZeroRedundancyOptimizer;
  const auto make = [] {
    torch::manual_seed(11);
    torch::nn::Sequential model;
    for (int i = 0; i < 8; ++i) model->push_back(torch::nn::Linear(16, 16));
    return model;
  };
  auto plain = make(), sharded = make();
  DataParallel plain_parallel(*plain, group), sharded_parallel(*sharded, group);
  torch::optim::Adam plain_optimizer(plain->parameters(), torch::optim::AdamOptions(1e-2));
  ZeroRedundancyOptimizer zero(sharded->parameters(), group, [](std::vector<at::Tensor> shard) {
    return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-2));
  });
  torch::manual_seed(100 + group->rank());  // each rank its own data
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = at::randn({6, 16}), y = at::randn({6, 16});
    plain_optimizer.zero_grad();
    plain_parallel.backward(torch::nn::functional::mse_loss(plain->forward(x), y));
    plain_optimizer.step();
    zero.zero_grad();
    sharded_parallel.backward(torch::nn::functional::mse_loss(sharded->forward(x), y));
    zero.step();
  }
  const auto a = plain->parameters(), b = sharded->parameters();
  for (size_t i = 0; i < a.size(); ++i) expect(at::equal(a[i], b[i]), "ZeRO-1's parameter " + std::to_string(i));
  const int64_t full = torchbridge::distributed::optimizer_state_bytes(plain_optimizer);
  const int64_t mine = zero.local_state_bytes();
  int64_t total = 0;
  for (const auto& each : group->all_gather(at::full({1}, mine, at::kLong))) total += each.item<int64_t>();
  expect(total == full, "the ZeRO-1 shards' state bytes summed");
  const double share = static_cast<double>(mine) / static_cast<double>(full);
  expect(share <= 1.0 / group->world_size() + 0.01, "this rank's share of the optimizer state");
  std::printf("rank %d of %d: ZeRO-1 after 5 Adam steps: parameters bit-identical to plain data parallel; "
              "optimizer state here %lld of %lld bytes (%.3f, 1/world = %.3f)\n", group->rank(), group->world_size(),
              static_cast<long long>(mine), static_cast<long long>(full), share, 1.0 / group->world_size());
}

double worst(double a, const at::Tensor& x, const at::Tensor& y) {
  return std::max(a, (x - y).abs().max().item<double>());
}

// Tensor parallel against the unsplit layers on the CPU, float64: an MLP (Linear 8 -> 32, GELU,
// Linear 32 -> 8), a column-parallel Linear 8 -> 32 that gathers its output, and
// torch::nn::MultiheadAttention (embed 16, 4 heads), built alike on every rank
// and split across all of them, on `device` (emu: collectives through host memory). The output,
// the input's gradient and each rank's slice of every weight gradient must equal the unsplit
// layer's. Returns the largest difference.
// Ranks handed different full layers (seeded by rank) each slice rank 0's: the split MLP equals
// rank 0's unsplit one on every rank. Each sliced its own before, and with the whole bias added
// after the all-reduce, ranks computed different outputs. A MultiheadAttention option the split
// cannot reproduce is refused.
double tensor_parallel_takes_rank_zeros_layers(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  namespace dist = torchbridge::distributed;
  const auto layers = [](uint64_t seed) {
    torch::manual_seed(seed);
    torch::nn::Linear up(8, 32), down(32, 8);
    up->to(at::kDouble);
    down->to(at::kDouble);
    return std::make_pair(up, down);
  };
  auto [up, down] = layers(900 + group->rank());
  auto [up_0, down_0] = layers(900);
  dist::ParallelMLP mlp(up, down, group);
  torch::manual_seed(1);
  const at::Tensor x = at::randn({5, 8}, at::kDouble);
  const double difference = (mlp->forward(x) - down_0->forward(at::gelu(up_0->forward(x)))).abs().max().item<double>();
  bool refused = false;
  try {
    dist::ParallelSelfAttention(torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(16, 4).add_zero_attn(true)),
                                group);
  } catch (const c10::Error& e) {
    refused = e.msg().find("does not take add_zero_attn") != std::string::npos;
  }
  expect(refused, "the refusal of add_zero_attn");
  return difference;
}

double tensor_parallel_against_unsplit(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group,
                                       c10::Device device) {
  namespace dist = torchbridge::distributed;
  const int rank = group->rank(), world = group->world_size();
  torch::manual_seed(5);  // the same layers and data on every rank
  torch::nn::Linear up(8, 32), down(32, 8);
  torch::nn::MultiheadAttention attention(torch::nn::MultiheadAttentionOptions(16, 4));
  up->to(at::kDouble);
  down->to(at::kDouble);
  attention->to(at::kDouble);
  const at::Tensor x_mlp = at::randn({5, 8}, at::kDouble), x_attention = at::randn({6, 3, 16}, at::kDouble);
  const at::Tensor w_mlp = at::randn({5, 8}, at::kDouble), w_attention = at::randn({6, 3, 16}, at::kDouble);
  double difference = 0;

  // A copy even on the CPU, where to() would return the tensor itself and requires_grad_() would
  // change the shared input.
  const auto copy_on = [](c10::Device where, const at::Tensor& x) { return x.to(where, false, /*copy=*/true); };
  const auto on_device = [device](const torch::nn::Linear& layer) {
    auto copy = std::dynamic_pointer_cast<torch::nn::LinearImpl>(layer->clone());
    copy->to(device);
    return torch::nn::Linear(copy);
  };
  dist::ParallelMLP mlp(on_device(up), on_device(down), group);
  const at::Tensor a = x_mlp.clone().requires_grad_(), b = copy_on(device, x_mlp).requires_grad_();
  const at::Tensor reference = down->forward(at::gelu(up->forward(a)));
  const at::Tensor parallel = mlp->forward(b).cpu();
  (reference * w_mlp).sum().backward();
  (parallel * w_mlp).sum().backward();
  difference = worst(worst(difference, parallel, reference), b.grad().cpu(), a.grad());
  const int64_t rows = 32 / world;
  difference = worst(difference, mlp->up->weight.grad().cpu(), up->weight.grad().narrow(0, rank * rows, rows));
  difference = worst(difference, mlp->up->bias.grad().cpu(), up->bias.grad().narrow(0, rank * rows, rows));
  difference = worst(difference, mlp->down->weight.grad().cpu(), down->weight.grad().narrow(1, rank * rows, rows));
  difference = worst(difference, mlp->down->bias.grad().cpu(), down->bias.grad());

  // A column-parallel layer that gathers its output (every rank gets the whole of it): forward
  // equals the unsplit layer; backward gives each rank its rows of the weight gradient.
  torch::nn::Linear whole(8, 32);
  whole->to(at::kDouble);
  dist::ColumnParallelLinear gathering(on_device(whole), group, /*gather_output=*/true);
  const at::Tensor e = x_mlp.clone().requires_grad_(), f = copy_on(device, x_mlp).requires_grad_();
  const at::Tensor whole_output = whole->forward(e);
  const at::Tensor gathered_output = gathering->forward(f).cpu();
  const at::Tensor w_whole = at::randn({5, 32}, at::kDouble);
  (whole_output * w_whole).sum().backward();
  (gathered_output * w_whole).sum().backward();
  difference = worst(worst(difference, gathered_output, whole_output), f.grad().cpu(), e.grad());
  difference = worst(difference, gathering->weight.grad().cpu(), whole->weight.grad().narrow(0, rank * rows, rows));
  difference = worst(difference, gathering->bias.grad().cpu(), whole->bias.grad().narrow(0, rank * rows, rows));

  auto attention_copy = std::dynamic_pointer_cast<torch::nn::MultiheadAttentionImpl>(attention->clone());
  attention_copy->to(device);
  dist::ParallelSelfAttention parallel_attention(torch::nn::MultiheadAttention(attention_copy), group);
  const at::Tensor c = x_attention.clone().requires_grad_(), d = copy_on(device, x_attention).requires_grad_();
  const at::Tensor attention_reference =
      std::get<0>(attention->forward(c, c, c, /*key_padding_mask=*/{}, /*need_weights=*/false));
  const at::Tensor attention_parallel = parallel_attention->forward(d).cpu();
  (attention_reference * w_attention).sum().backward();
  (attention_parallel * w_attention).sum().backward();
  difference = worst(worst(difference, attention_parallel, attention_reference), d.grad().cpu(), c.grad());
  const int64_t per_rank = 16 / world;  // heads * head_dim on this rank
  const at::Tensor in_grad = attention->in_proj_weight.grad();
  const at::Tensor expected = at::cat({in_grad.narrow(0, rank * per_rank, per_rank),
                                       in_grad.narrow(0, 16 + rank * per_rank, per_rank),
                                       in_grad.narrow(0, 32 + rank * per_rank, per_rank)});
  difference = worst(difference, parallel_attention->qkv_weight.grad().cpu(), expected);
  difference = worst(difference, parallel_attention->out->weight.grad().cpu(),
                     attention->out_proj->weight.grad().narrow(1, rank * per_rank, per_rank));

  // A dimension the group does not divide is refused before any computation.
  if (world > 1 && device.is_cpu()) {
    torch::nn::Linear odd(8, world + 1);
    bool refused = false;
    try {
      dist::ColumnParallelLinear layer(odd, group, false);
    } catch (const c10::Error& e) {
      refused = e.msg().find("out_features " + std::to_string(world + 1) + " does not divide into " +
                             std::to_string(world) + " equal shares") != std::string::npos;
    }
    expect(refused, "the refusal of a dimension the group does not divide");
  }
  return difference;
}

// Pipeline parallel against the unsplit model, float64: 4 blocks (Linear 8 -> 8, Tanh) split
// into one stage per rank, a batch of 8 rows in 8 micro-batches, both schedules. Each stage's
// gradients and the loss must equal the unsplit model's on the whole batch, and each schedule
// must hold the activations it promises: GPipe all 8 micro-batches, 1F1B stages - stage.
double pipeline_against_unsplit(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group,
                                torchbridge::distributed::PipelineSchedule schedule, c10::Device device) {
  namespace dist = torchbridge::distributed;
  const int rank = group->rank(), world = group->world_size();
  constexpr int kBlocks = 4;
  expect(kBlocks % world == 0, "a world that divides the 4 blocks");
  torch::manual_seed(9);  // the same model and batch on every rank
  std::vector<torch::nn::Linear> blocks;
  torch::nn::Sequential whole, stage;
  for (int b = 0; b < kBlocks; ++b) {
    blocks.emplace_back(8, 8);
    blocks.back()->to(at::kDouble);
    whole->push_back(blocks.back());
    whole->push_back(torch::nn::Tanh());
  }
  const int per_stage = kBlocks / world;
  std::vector<torch::nn::Linear> mine;
  for (int b = rank * per_stage; b < (rank + 1) * per_stage; ++b) {
    mine.emplace_back(8, 8);
    mine.back()->to(at::kDouble);
    {
      const at::NoGradGuard no_grad;
      mine.back()->weight.copy_(blocks[static_cast<size_t>(b)]->weight);
      mine.back()->bias.copy_(blocks[static_cast<size_t>(b)]->bias);
    }
    mine.back()->to(device);
    stage->push_back(mine.back());
    stage->push_back(torch::nn::Tanh());
  }
  const at::Tensor x = at::randn({8, 8}, at::kDouble), y = at::randn({8, 8}, at::kDouble);
  const at::Tensor reference_loss = torch::nn::functional::mse_loss(whole->forward(x), y);
  reference_loss.backward();

  dist::Pipeline pipeline([&](const at::Tensor& input) { return stage->forward(input); }, group, schedule, device);
  if (rank == 0 && !device.is_cpu()) {  // a batch left on the CPU is named before anything is sent
    bool refused = false;
    try {
      pipeline.train_step(x, y, 8, [](const at::Tensor& output, const at::Tensor&) { return output.sum(); });
    } catch (const c10::Error& e) {
      refused = e.msg().find("computes on " + device.str() + " but the batch's inputs are on cpu") != std::string::npos;
    }
    expect(refused, "the refusal of a batch on another device than the stage");
  }
  const double loss = pipeline.train_step(x.to(device), y.to(device), 8, [](const at::Tensor& output, const at::Tensor& target) {
    return torch::nn::functional::mse_loss(output, target);
  });
  const int64_t promised = schedule == dist::PipelineSchedule::gpipe ? 8 : world - rank;
  expect(pipeline.peak_micro_batches_held() == promised,
         "the micro-batches held at once (" + std::to_string(pipeline.peak_micro_batches_held()) + ", expected " +
             std::to_string(promised) + ")");
  double difference = std::abs(loss - reference_loss.item<double>());
  for (int b = 0; b < per_stage; ++b) {
    const auto& reference = blocks[static_cast<size_t>(rank * per_stage + b)];
    difference = worst(difference, mine[static_cast<size_t>(b)]->weight.grad().cpu(), reference->weight.grad());
    difference = worst(difference, mine[static_cast<size_t>(b)]->bias.grad().cpu(), reference->bias.grad());
  }
  return difference;
}

// A pipeline whose first stage is frozen and hands token ids (an integer tensor) to an embedding:
// stage 0 has no graph to run backward through and its output cannot require a gradient (both
// raised, leaving the other ranks waiting). The trained stages' gradients equal the unsplit
// model's. Returns the largest difference.
double pipeline_from_a_frozen_tokenizing_stage(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  namespace dist = torchbridge::distributed;
  const int rank = group->rank(), world = group->world_size();
  torch::manual_seed(13);  // the same model and batch on every rank
  torch::nn::Linear frozen(8, 8);
  frozen->weight.requires_grad_(false);
  frozen->bias.requires_grad_(false);
  torch::nn::Embedding embed(8, 8);
  std::vector<torch::nn::Linear> blocks;
  for (int b = 2; b < world; ++b) blocks.emplace_back(8, 8);
  const auto stage_forward = [&](int stage, const at::Tensor& input) {
    if (stage == 0) return frozen->forward(input).argmax(-1);
    if (stage == 1) return embed->forward(input);
    return at::tanh(blocks[static_cast<size_t>(stage - 2)]->forward(input));
  };
  const at::Tensor x = at::randn({8, 8}), y = at::randn({8, 8});
  const auto mse = [](const at::Tensor& output, const at::Tensor& target) {
    return torch::nn::functional::mse_loss(output, target);
  };
  // The unsplit model's gradients, then cleared for the pipeline's (the same modules).
  at::Tensor whole = x;
  for (int stage = 0; stage < world; ++stage) whole = stage_forward(stage, whole);
  const double reference_loss = mse(whole, y).item<double>();
  mse(whole, y).backward();
  std::vector<at::Tensor> reference_grads;
  for (auto& p : embed->parameters()) reference_grads.push_back(p.grad().clone());
  for (auto& block : blocks) {
    for (auto& p : block->parameters()) reference_grads.push_back(p.grad().clone());
  }
  for (auto& p : embed->parameters()) p.mutable_grad() = at::Tensor();
  for (auto& block : blocks) {
    for (auto& p : block->parameters()) p.mutable_grad() = at::Tensor();
  }
  dist::Pipeline pipeline([&](const at::Tensor& input) { return stage_forward(rank, input); }, group);
  const double loss = pipeline.train_step(x, y, 4, mse);
  double difference = std::abs(loss - reference_loss);
  size_t index = 0;
  const auto compare_stage = [&](torch::nn::Module& module, int stage) {
    for (auto& p : module.parameters()) {
      if (stage == rank) difference = worst(difference, p.grad(), reference_grads[index]);
      ++index;
    }
  };
  compare_stage(*embed, 1);
  for (size_t b = 0; b < blocks.size(); ++b) compare_stage(*blocks[b], static_cast<int>(b) + 2);
  return difference;
}

// Data parallel with ZeRO-1 on emu, an SDK device: gradients and the parameter exchange travel
// through host memory. Each rank trains on its share of a 24-row batch; the reference is one
// process on the CPU with plain Adam on the whole batch, float64. Returns the largest difference.
double sdk_device_against_one_cpu_process(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  namespace dist = torchbridge::distributed;
  const int rank = group->rank(), world = group->world_size();
  const c10::Device emu = torchbridge::create_backend("emu")->device(0);
  torch::manual_seed(21);
  const at::Tensor inputs = at::randn({24, 8}, at::kDouble), targets = at::randn({24, 4}, at::kDouble);
  auto model = make_model(200 + rank), reference = make_model(200);  // DataParallel takes rank 0's weights
  model->to(emu);
  dist::DataParallel parallel(*model, group);
  dist::ZeroRedundancyOptimizer zero(model->parameters(), group, [](std::vector<at::Tensor> shard) {
    return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-2));
  });
  torch::optim::Adam reference_optimizer(reference->parameters(), torch::optim::AdamOptions(1e-2));
  const int64_t share = 24 / world;
  const at::Tensor x = inputs.narrow(0, rank * share, share).to(emu), y = targets.narrow(0, rank * share, share).to(emu);
  for (int step = 0; step < 4; ++step) {
    zero.zero_grad();
    parallel.backward(torch::nn::functional::mse_loss(model->forward(x), y));
    zero.step();
    reference_optimizer.zero_grad();
    torch::nn::functional::mse_loss(reference->forward(inputs), targets).backward();
    reference_optimizer.step();
  }
  torch::nn::Sequential back = make_model(0);
  const auto on_device = model->parameters(), on_cpu = back->parameters();
  {
    const at::NoGradGuard no_grad;
    for (size_t i = 0; i < on_cpu.size(); ++i) on_cpu[i].copy_(on_device[i].cpu());
  }
  return max_difference(*back, *reference);
}

}  // namespace

// A model only rank 1 refuses on its own (a sparse embedding there) is refused on every rank: rank 0
// was left in the parameter agreement's gather, to fail on a lost peer without saying why.
void refuse_what_one_rank_refuses(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  torch::nn::Sequential model(torch::nn::Linear(8, 4));
  if (group->rank() == 1) model->push_back(torch::nn::Embedding(torch::nn::EmbeddingOptions(4, 2).sparse(true)));
  try {
    torchbridge::distributed::DataParallel parallel(*model, group);
  } catch (const c10::ValueError& e) {
    const std::string message = e.msg();
    const std::string expected = group->rank() == 1 ? "DataParallel: module '1' makes sparse gradients"
                                                    : "DataParallel, rank 0 of 2: rank 1 refused, so this rank stops "
                                                      "too. Rank 1 said: DataParallel: module '1' makes sparse";
    expect(message.find(expected) != std::string::npos, "the refusal (" + message.substr(0, 300) + ")");
    std::printf("rank %d: a model one rank refuses refused: %s\n", group->rank(), message.substr(0, 200).c_str());
    return;
  }
  throw std::runtime_error("DataParallel accepted a model rank 1 refuses");
}

// Ranks whose models differ (a hidden size that depends on the rank) must be refused when
// DataParallel starts, on every rank, before any training.
int refuse_mismatched_models(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group) {
  torch::nn::Sequential model(torch::nn::Linear(8, 16 + group->rank()), torch::nn::Linear(16 + group->rank(), 4));
  try {
    torchbridge::distributed::DataParallel parallel(*model, group);
  } catch (const c10::Error& e) {
    const std::string message = e.msg();
    expect(message.find("the model differs across ranks (ranks [1] do not match rank 0's") != std::string::npos,
           "the mismatch error (" + message.substr(0, 300) + ")");
    std::printf("rank %d: mismatched models refused: %s\n", group->rank(), message.substr(0, 200).c_str());
    refuse_what_one_rank_refuses(group);
    return 0;
  }
  throw std::runtime_error("DataParallel accepted models that differ across ranks");
}

// Trains with DataParallel until rank `victim` is lost at step 3: by SIGKILL, by SIGSTOP (a
// process that hangs; its heartbeat stops too), or by finishing early (signal 0: it returns). The survivors must fail within the timeout with an
// error naming the victim (tests/python/test_distributed_faults.py checks it and reaps the victim).
int lose_a_rank(const std::shared_ptr<torchbridge::distributed::ProcessGroup>& group, int victim, int signal) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  torchbridge::distributed::DataParallel parallel(*model, group);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  for (int step = 0; step < 1'000'000; ++step) {
    if (step == 3 && group->rank() == victim) {
      if (signal == 0) return 0;
      std::raise(signal);
    }
    optimizer.zero_grad();
    parallel.backward(torch::nn::functional::mse_loss(model->forward(at::randn({4, 8})), at::zeros({4, 4})));
    optimizer.step();
  }
  throw std::runtime_error("training went on after rank " + std::to_string(victim) + " was lost");
}

int main(int argc, char** argv) {
  using torchbridge::distributed::init;
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    torchbridge::distributed::InitOptions options;
    // lose-rank VICTIM kill|stop|finish TIMEOUT_MS
    options.timeout = std::chrono::milliseconds(mode == "lose-rank" && argc > 4 ? std::stoll(argv[4]) : 60'000);
    const auto group = init(options);
    if (mode == "mismatched-models") return refuse_mismatched_models(group);
    if (mode == "lose-rank" && argc > 4) {
      const std::string how = argv[3];
      return lose_a_rank(group, std::stoi(argv[2]), how == "stop" ? SIGSTOP : how == "finish" ? 0 : SIGKILL);
    }
    const int rank = group->rank(), world = group->world_size();
    expect(group->environment().launched, "launched by torchrun");
    // emu is loaded before the process's first backward pass, as PyTorch's autograd engine
    // requires of any device (docs/device-sdk.md).
    torchbridge::create_backend("emu");

    at::Tensor sum = at::full({5}, static_cast<double>(rank + 1), at::kDouble);
    group->all_reduce_sum(sum);
    expect(at::all(sum == world * (world + 1) / 2.0).item<bool>(), "all_reduce_sum");

    const int root = world - 1;
    at::Tensor sent = at::full({3}, rank == root ? 42 : -1, at::kLong);
    group->broadcast(sent, root);
    expect(at::all(sent == 42).item<bool>(), "broadcast");

    const auto parts = group->all_gather(at::full({2}, static_cast<float>(rank)));
    expect(static_cast<int>(parts.size()) == world, "all_gather's count");
    for (int r = 0; r < world; ++r) expect(at::all(parts[r] == static_cast<float>(r)).item<bool>(), "all_gather");

    group->barrier();
    std::printf("rank %d of %d (local %d of %d): all_reduce, broadcast, all_gather, barrier agree\n", rank, world,
                group->environment().local_rank, group->environment().local_world_size);

    const double difference = data_parallel_against_one_process(group);
    std::printf("rank %d of %d: DataParallel after 6 steps (2 accumulated) vs one process on the whole batch: "
                "max |difference| %.3g\n", rank, world, difference);
    expect(difference <= 1e-12, "DataParallel's parameters against one-process training");
    const double unused = unused_parameters_against_one_process(group);
    std::printf("rank %d of %d: DataParallel with find_unused_parameters, a layer unused: the used one vs one "
                "process, max |difference| %.3g; the unused one unchanged\n", rank, world, unused);
    expect(unused <= 1e-12, "DataParallel with an unused layer against one-process training");
    zero_one_against_plain_data_parallel(group);
    const double tokenizing = pipeline_from_a_frozen_tokenizing_stage(group);
    std::printf("rank %d of %d: pipeline from a frozen stage handing token ids to an embedding vs unsplit: max "
                "|difference| %.3g\n", rank, world, tokenizing);
    expect(tokenizing <= 1e-6, "a pipeline from a frozen, tokenizing stage against the unsplit model");
    const double rank_zeros = tensor_parallel_takes_rank_zeros_layers(group);
    std::printf("rank %d of %d: tensor-parallel MLP from layers seeded by rank vs rank 0's unsplit MLP: max "
                "|difference| %.3g\n", rank, world, rank_zeros);
    expect(rank_zeros <= 1e-12, "tensor parallel from different layers against rank 0's");
    const c10::Device emu = torchbridge::create_backend("emu")->device(0);
    for (const c10::Device device : {c10::Device(c10::kCPU), emu}) {
      const double tensor_parallel = tensor_parallel_against_unsplit(group, device);
      std::printf("rank %d of %d: tensor-parallel MLP and self-attention on %s vs unsplit on the CPU (outputs, input "
                  "and weight gradients): max |difference| %.3g\n", rank, world, device.str().c_str(), tensor_parallel);
      expect(tensor_parallel <= 1e-12, "tensor parallel against the unsplit layers");
    }
    const double sdk = sdk_device_against_one_cpu_process(group);
    std::printf("rank %d of %d: DataParallel + ZeRO-1 on emu (through host memory), 4 Adam steps, vs one CPU process "
                "on the whole batch: max |difference| %.3g\n", rank, world, sdk);
    expect(sdk <= 1e-12, "data parallel on an SDK device against one CPU process");
    for (const auto schedule : {torchbridge::distributed::PipelineSchedule::gpipe,
                                torchbridge::distributed::PipelineSchedule::one_f_one_b}) {
      for (const c10::Device device : {c10::Device(c10::kCPU), emu}) {
        const double pipeline = pipeline_against_unsplit(group, schedule, device);
        std::printf("rank %d of %d: pipeline (%s, 8 micro-batches) on %s vs unsplit on the CPU (loss, stage "
                    "gradients): max |difference| %.3g\n", rank, world,
                    schedule == torchbridge::distributed::PipelineSchedule::gpipe ? "GPipe" : "1F1B",
                    device.str().c_str(), pipeline);
        expect(pipeline <= 1e-12, "pipeline parallel against the unsplit model");
      }
    }
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "distributed_worker: %s\n", e.msg().c_str());  // without the C++ backtrace
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_worker: %s\n", e.what());
    return 1;
  }
}

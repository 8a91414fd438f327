// `torchbridge train`: trains a built-in model alone or as one rank of a torchrun job, with data
// parallel or ZeRO-1, and reports every rank's loss and a fingerprint of its final parameters.
#include "arguments.h"
#include "commands.h"
#include "portability_training.h"
#include "printable_json.h"
#include "text_format.h"
#include "train_model_parallel.h"

#include <torchbridge/checkpoint/training_state.h>
#include <torchbridge/distributed/data_parallel.h>
#include <torchbridge/distributed/fingerprint.h>
#include <torchbridge/distributed/process_group.h>
#include <torchbridge/distributed/zero_optimizer.h>
#include <torchbridge/error_summary.h>
#include <torchbridge/parse_integer.h>
#include <torchbridge/registry.h>
#include <torchbridge/validation/builtin_models.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DeviceType.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge train --model builtin:NAME [--steps N]
                         [--data-parallel | --zero1 | --tensor-parallel K | --pipeline-parallel K]
                         [--micro-batches M] [--schedule gpipe|1f1b]
                         [--global-batch B] [--seed S] [--device NAME] [--timeout-seconds T]
                         [--save FILE] [--resume FILE] [--json]

Trains a built-in model (mlp, cnn, transformer) with Adam to imitate a differently initialised
copy of itself on random inputs (no dataset needed). Runs alone, or as every rank of a torchrun job:
  torchrun --nproc-per-node 2 --no-python torchbridge train --model builtin:mlp --data-parallel

  --steps N          training steps in all, counting those a resumed run already did (default 20)
  --data-parallel    every rank trains on its share of each global batch; gradients are averaged
                     across ranks during backward (torchbridge::distributed::DataParallel)
  --zero1            data parallel with Adam's state sharded across ranks (ZeroRedundancyOptimizer)
  --tensor-parallel K  builtin:mlp split across K ranks (the whole job): fc1 column-parallel, fc2
                     row-parallel, fc3 replicated; every rank sees the whole global batch
  --pipeline-parallel K  builtin:mlp's three layers as K stages (K <= 3), one per rank, over
                     --micro-batches M (default 4) with --schedule 1f1b (default) or gpipe
  --global-batch B   rows per step over all ranks, split equally (default 24); must divide by the
                     number of ranks
  --seed S           initial weights and data (default 0); step k's batch depends on S and k only,
                     so any number of ranks sees the same global batches
  --device NAME      where to train (default cpu): the CPU or an SDK device (emu), whose tensors
                     cross ranks through host memory (Gloo), or cuda, where data parallel and
                     ZeRO-1 reduce over NCCL, each rank on the GPU of its LOCAL_RANK (tensor and
                     pipeline parallel take cpu or an SDK device)
  --timeout-seconds  how long a collective waits for the other ranks (default 60); a lost rank
                     makes every other rank exit 1 naming it
  --save FILE        rank 0 writes the training state (model, Adam, step) as safetensors at the
                     end; with --zero1 the state is gathered from every rank first
  --resume FILE      continue from a saved training state, with any number of ranks
  --json             rank 0 prints one JSON report; other ranks print nothing

Rank 0 reports every rank's first and last loss (on its own share) and a fingerprint of its final
parameters; they must all be equal (exit 1 otherwise). Every rank must be started with the same
options: a difference is an error naming the ranks and the option before training starts.
)";

enum class Parallelism { none, data_parallel, zero1, tensor_parallel, pipeline_parallel };

std::string to_string(Parallelism mode) {
  switch (mode) {
    case Parallelism::none: return "none";
    case Parallelism::data_parallel: return "data-parallel";
    case Parallelism::zero1: return "zero1";
    case Parallelism::tensor_parallel: return "tensor-parallel";
    case Parallelism::pipeline_parallel: return "pipeline-parallel";
  }
  return "?";
}

bool splits_the_model(Parallelism mode) {
  return mode == Parallelism::tensor_parallel || mode == Parallelism::pipeline_parallel;
}

struct TrainOptions {
  std::string model;  // built-in name
  int64_t steps = 20;
  Parallelism mode = Parallelism::none;
  int64_t global_batch = 24;
  uint64_t seed = 0;
  std::string device = "cpu";
  int64_t timeout_seconds = 60;
  int64_t split_ranks = 0;     // K of --tensor-parallel K / --pipeline-parallel K
  int64_t micro_batches = 4;   // pipeline parallel
  distributed::PipelineSchedule schedule = distributed::PipelineSchedule::one_f_one_b;
  std::optional<std::string> save, resume;
  bool json = false;
};

TrainOptions parse_train_options(const ParsedArguments& parsed) {
  TrainOptions options;
  const std::string* model = parsed.option("--model");
  if (!model) throw UsageError("train needs --model builtin:NAME (mlp, cnn, transformer)");
  const std::string prefix = "builtin:";
  if (model->rfind(prefix, 0) != 0) {
    throw UsageError("--model '" + *model + "': train takes built-in models, builtin:NAME (mlp, cnn, transformer)");
  }
  options.model = model->substr(prefix.size());
  try {
    validation::builtin_model_info(options.model);
  } catch (const c10::Error& e) {
    throw UsageError("--model " + *model + ": " + error_summary(e.msg()));
  }
  std::vector<std::pair<std::string, Parallelism>> modes;
  if (parsed.has("--data-parallel")) modes.emplace_back("--data-parallel", Parallelism::data_parallel);
  if (parsed.has("--zero1")) modes.emplace_back("--zero1", Parallelism::zero1);
  if (parsed.option("--tensor-parallel")) modes.emplace_back("--tensor-parallel", Parallelism::tensor_parallel);
  if (parsed.option("--pipeline-parallel")) modes.emplace_back("--pipeline-parallel", Parallelism::pipeline_parallel);
  if (modes.size() > 1) {
    throw UsageError(modes[0].first + " and " + modes[1].first +
                     " exclude each other: one parallel mode per run (combining them is not built)");
  }
  if (!modes.empty()) options.mode = modes[0].second;
  if (splits_the_model(options.mode)) {
    const std::string flag = modes[0].first;
    options.split_ranks = parse_integer(*parsed.option(flag), flag, 1, 1024);
    if (options.model != "mlp") {
      throw UsageError(flag + " trains builtin:mlp only: the tensor- and pipeline-parallel layers exist "
                       "(include/torchbridge/distributed/), but splitting builtin:" + options.model +
                       " would need its TorchScript graph rebuilt as torch::nn modules");
    }
  }
  for (const char* pipeline_only : {"--micro-batches", "--schedule"}) {
    if (parsed.option(pipeline_only) && options.mode != Parallelism::pipeline_parallel) {
      throw UsageError(std::string(pipeline_only) + " sets how --pipeline-parallel feeds its stages; without " +
                       "--pipeline-parallel it would change nothing");
    }
  }
  if (const auto* text = parsed.option("--micro-batches")) {
    options.micro_batches = parse_integer(*text, "--micro-batches", 1, 1'000'000);
  }
  if (const auto* text = parsed.option("--schedule")) {
    if (*text != "gpipe" && *text != "1f1b") throw UsageError("--schedule '" + *text + "' is not gpipe or 1f1b");
    options.schedule = *text == "gpipe" ? distributed::PipelineSchedule::gpipe
                                        : distributed::PipelineSchedule::one_f_one_b;
  }
  if (const auto* text = parsed.option("--steps")) options.steps = parse_integer(*text, "--steps", 1, 1'000'000'000);
  if (const auto* text = parsed.option("--global-batch")) {
    options.global_batch = parse_integer(*text, "--global-batch", 1, 1'000'000);
  }
  if (const auto* text = parsed.option("--seed")) options.seed = parse_unsigned(*text, "--seed");
  if (const auto* text = parsed.option("--device")) options.device = *text;
  if (const auto* text = parsed.option("--timeout-seconds")) {
    options.timeout_seconds = parse_integer(*text, "--timeout-seconds", 1, 86'400);
  }
  if (const auto* text = parsed.option("--save")) {
    check_output_file(*text, "--save");  // now, not after the whole run has trained
    options.save = *text;
  }
  if (const auto* text = parsed.option("--resume")) options.resume = *text;
  options.json = parsed.has("--json");
  if (splits_the_model(options.mode)) {
    if (options.save || options.resume) {
      throw UsageError("--save and --resume are not supported with " + to_string(options.mode) +
                       " yet: the optimizer state stays split across the ranks");
    }
  }
  return options;
}

// Every rank must run the same job: the options that shape it are gathered and compared with
// rank 0's before anything trains, so a rank started differently is named instead of hanging
// in a collective later.
void check_every_rank_agrees(distributed::ProcessGroup& group, const TrainOptions& options) {
  const auto& models = validation::builtin_models();
  int64_t model_index = 0;
  while (models[static_cast<size_t>(model_index)].name != options.model) ++model_index;
  const std::vector<std::pair<std::string, int64_t>> fields = {
      {"--model", model_index},
      {"--steps", options.steps},
      {"--global-batch", options.global_batch},
      {"--seed", static_cast<int64_t>(options.seed)},
      {"the parallel mode", static_cast<int64_t>(options.mode)},
      {"--resume (given or not)", options.resume ? 1 : 0},
      {"--micro-batches", options.micro_batches},
      {"--schedule (0 gpipe, 1 1f1b)", static_cast<int64_t>(options.schedule)},
      // By device type: a rank on emu beside one on the CPU would train, each reducing its
      // gradients its own way, to different numbers.
      // device_type_of loads and creates nothing: a rank whose device is unavailable fails after
      // the gather, not before it while the others wait.
      {"--device", static_cast<int64_t>(BackendRegistry::instance().device_type_of(options.device))},
  };
  std::vector<int64_t> values;
  for (const auto& field : fields) values.push_back(field.second);
  const auto gathered = group.all_gather(at::tensor(values, at::kLong));
  std::string differences;
  for (size_t rank = 1; rank < gathered.size(); ++rank) {
    for (size_t f = 0; f < fields.size(); ++f) {
      const int64_t theirs = gathered[rank][static_cast<int64_t>(f)].item<int64_t>();
      const int64_t ranks_zero = gathered[0][static_cast<int64_t>(f)].item<int64_t>();
      if (theirs == ranks_zero) continue;
      const auto shown = [&](int64_t value) {
        if (f == 0) return models[static_cast<size_t>(value)].name;
        if (f == 4) return to_string(static_cast<Parallelism>(value));
        if (fields[f].first == "--device") {
          // Every rank words it alike: one that has not loaded the SDK device knows PrivateUse1 only
          // by torch's name for it.
          const auto type = static_cast<c10::DeviceType>(value);
          return type == c10::DeviceType::PrivateUse1 ? std::string("an SDK device")
                                                      : c10::DeviceTypeName(type, /*lower_case=*/true);
        }
        return std::to_string(value);
      };
      differences += (differences.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " has " +
                     fields[f].first + " " + shown(theirs) + ", rank 0 has " + shown(ranks_zero);
    }
  }
  if (!differences.empty()) {
    throw UsageError("the ranks were started with different options (" + differences +
                     "): start every rank with the same command");
  }
}

struct RankResult {
  double first_loss = 0, last_loss = 0;
  uint64_t fingerprint = 0;
  int64_t optimizer_state_bytes = 0;
};

at::Tensor global_batch(const std::vector<int64_t>& input_shape, int64_t rows, uint64_t seed, int64_t step) {
  std::vector<int64_t> shape = input_shape;
  shape[0] = rows;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed * 1'000'003ULL + static_cast<uint64_t>(step));
  return at::randn(shape, generator, at::TensorOptions());
}

distributed::ModelTensors tensors_of(const torch::jit::Module& model) {
  distributed::ModelTensors tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) tensors.parameters.emplace_back(item.name, item.value);
  for (const auto& buffer : model.buffers(/*recurse=*/true)) tensors.buffers.push_back(buffer);
  return tensors;
}

std::vector<at::Tensor> parameters_of(const torch::jit::Module& model) {
  std::vector<at::Tensor> parameters;
  for (const auto& p : model.parameters()) parameters.push_back(p);
  return parameters;
}

RankResult train(const std::shared_ptr<distributed::ProcessGroup>& shared, const TrainOptions& options,
                 int64_t& start_step) {
  distributed::ProcessGroup& group = *shared;
  const int rank = group.rank(), world = group.world_size();
  const auto& info = validation::builtin_model_info(options.model);
  const c10::Device device = distributed::rank_device(group, *create_backend(options.device));
  torch::jit::Module model = validation::make_builtin_model(options.model, options.seed);
  torch::jit::Module teacher = validation::make_builtin_model(options.model, options.seed + 1000);
  model.to(device);
  teacher.to(device);
  model.train();
  teacher.eval();

  // Resuming: every rank reads the same file, so model and optimizer start where the saved run
  // stopped, whatever number of ranks saved it. A ZeRO-1 rank then keeps its shard of the state.
  std::unique_ptr<torch::optim::Optimizer> full_optimizer = make_optimizer(model);
  start_step = 0;
  if (options.resume) {
    checkpoint::RestoreOptions restore;
    restore.device_map = {{"", device}};
    const checkpoint::TrainingProgress resumed =
        checkpoint::load_training_state(*options.resume, model, *full_optimizer, restore);
    start_step = resumed.step;
    // The teacher and every batch follow the seed: resumed under another one, training went on
    // towards other targets, silently.
    const auto saved_seed = resumed.user_metadata.find("torchbridge.train.seed");
    if (saved_seed != resumed.user_metadata.end() && saved_seed->second != std::to_string(options.seed)) {
      throw UsageError("--resume " + *options.resume + " was trained with --seed " + saved_seed->second +
                       ", and this run has --seed " + std::to_string(options.seed) +
                       " (the teacher model and the data follow the seed); pass --seed " + saved_seed->second);
    }
    if (start_step >= options.steps) {
      throw UsageError("--resume " + *options.resume + " is at step " + std::to_string(start_step) +
                       ", not before --steps " + std::to_string(options.steps) + ": nothing to train");
    }
  }
  if (splits_the_model(options.mode)) {
    // The whole global batch on every rank: the ranks split the model, not the data.
    const auto batch = [&](int64_t step) {
      const at::Tensor x = global_batch(info.input_shape, options.global_batch, options.seed, step).to(device);
      const at::NoGradGuard no_grad;
      return std::make_pair(x, teacher.forward({x}).toTensor());
    };
    const ModelParallelRun run =
        options.mode == Parallelism::tensor_parallel
            ? train_mlp_tensor_parallel(model, shared, options.steps, batch)
            : train_mlp_pipeline_parallel(model, shared, options.steps, batch, options.micro_batches, options.schedule);
    return {run.first_loss, run.last_loss, distributed::fingerprint(parameters_of(model)), run.optimizer_state_bytes};
  }
  std::unique_ptr<distributed::DataParallel> parallel;
  std::unique_ptr<distributed::ZeroRedundancyOptimizer> zero;
  if (options.mode != Parallelism::none) {
    parallel = std::make_unique<distributed::DataParallel>(tensors_of(model), shared);
  }
  if (options.mode == Parallelism::zero1) {
    zero = std::make_unique<distributed::ZeroRedundancyOptimizer>(
        parameters_of(model), shared, [](std::vector<at::Tensor> shard) { return make_optimizer(std::move(shard)); });
    zero->load_state_from(*full_optimizer);
    full_optimizer.reset();  // only the shard's state stays
  }

  const int64_t share = options.global_batch / world;
  torch::jit::GraphOptimizerEnabledGuard unoptimized(false);  // as the portability run trains
  RankResult result;
  for (int64_t step = start_step; step < options.steps; ++step) {
    const at::Tensor x = global_batch(info.input_shape, options.global_batch, options.seed, step)
                             .narrow(0, rank * share, share)
                             .to(device);
    at::Tensor target;
    {
      const at::NoGradGuard no_grad;
      target = teacher.forward({x}).toTensor();
    }
    const at::Tensor loss = at::mse_loss(model.forward({x}).toTensor(), target);
    if (zero) {
      zero->zero_grad();
      parallel->backward(loss);
      zero->step();
    } else {
      full_optimizer->zero_grad();
      if (parallel) {
        parallel->backward(loss);
      } else {
        loss.backward();
      }
      full_optimizer->step();
    }
    const double value = loss.item<double>();
    if (step == start_step) result.first_loss = value;
    result.last_loss = value;
  }
  result.fingerprint = distributed::fingerprint(parameters_of(model));
  result.optimizer_state_bytes =
      zero ? zero->local_state_bytes() : distributed::optimizer_state_bytes(*full_optimizer);

  if (options.save) {
    std::unique_ptr<torch::optim::Optimizer> to_save;
    if (zero) {
      if (rank == 0) to_save = make_optimizer(model);
      zero->consolidate_state_into(to_save.get(), 0);
    }
    if (rank == 0) {
      checkpoint::TrainingProgress progress;
      progress.step = options.steps;
      progress.user_metadata = {{"torchbridge.train.model", "builtin:" + options.model},
                                {"torchbridge.train.world_size", std::to_string(world)},
                                {"torchbridge.train.mode", to_string(options.mode)},
                                {"torchbridge.train.seed", std::to_string(options.seed)}};
      checkpoint::save_training_state(*options.save, model, zero ? *to_save : *full_optimizer, progress);
    }
    group.barrier();  // the file is complete before any rank reports success
  }
  return result;
}

}  // namespace

int run_train(const std::vector<std::string>& args) {
  const ParsedArguments parsed =
      parse_arguments("train", args,
                      {{"--data-parallel", "--zero1", "--json"},
                       {"--model", "--steps", "--global-batch", "--seed", "--device", "--timeout-seconds", "--save",
                        "--resume", "--tensor-parallel", "--pipeline-parallel", "--micro-batches", "--schedule"},
                       false});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  const TrainOptions options = parse_train_options(parsed);
  distributed::InitOptions init;
  init.device = options.device;
  init.timeout = std::chrono::seconds(options.timeout_seconds);
  const auto group = distributed::init(init);
  const int world = group->world_size();
  if (world > 1 && options.mode == Parallelism::none) {
    throw UsageError("this is rank " + std::to_string(group->rank()) + " of " + std::to_string(world) +
                     " (torchrun): give a parallel mode (--data-parallel, --zero1, --tensor-parallel K, "
                     "--pipeline-parallel K), or every rank would train a copy of its own");
  }
  if (splits_the_model(options.mode) && options.split_ranks != world) {
    throw UsageError("--" + to_string(options.mode) + " " + std::to_string(options.split_ranks) + " needs exactly " +
                     std::to_string(options.split_ranks) + " ranks, this job has " + std::to_string(world) +
                     " (combining it with data parallel is not built)");
  }
  if (options.mode == Parallelism::pipeline_parallel && options.global_batch % options.micro_batches != 0) {
    throw UsageError("--global-batch " + std::to_string(options.global_batch) + " does not split into " +
                     std::to_string(options.micro_batches) + " equal micro-batches");
  }
  if (!splits_the_model(options.mode) && options.global_batch % world != 0) {
    throw UsageError("--global-batch " + std::to_string(options.global_batch) + " does not divide into " +
                     std::to_string(world) + " equal shares, one per rank");
  }
  check_every_rank_agrees(*group, options);

  const auto start = std::chrono::steady_clock::now();
  int64_t start_step = 0;
  const RankResult mine = train(group, options, start_step);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Every rank's result, gathered on every rank (each decides its exit code the same way).
  const at::Tensor packed = at::tensor({mine.first_loss, mine.last_loss, static_cast<double>(mine.optimizer_state_bytes)},
                                       at::kDouble);
  const auto losses = group->all_gather(packed);
  const auto fingerprints = group->all_gather(at::full({1}, static_cast<int64_t>(mine.fingerprint), at::kLong));
  bool identical = true;
  for (const auto& other : fingerprints) identical = identical && other.item<int64_t>() == fingerprints[0].item<int64_t>();

  if (group->rank() == 0) {
    nlohmann::json report = {{"model", "builtin:" + options.model},
                             {"mode", to_string(options.mode)},
                             {"world_size", world},
                             {"device", options.device},
                             {"steps", options.steps},
                             {"resumed_at_step", start_step},
                             {"global_batch", options.global_batch},
                             {"seconds", seconds},
                             {"parameters_identical_across_ranks", identical},
                             {"ranks", nlohmann::json::array()}};
    for (int r = 0; r < world; ++r) {
      report["ranks"].push_back(
          {{"rank", r},
           {"first_loss", losses[r][0].item<double>()},
           {"last_loss", losses[r][1].item<double>()},
           {"optimizer_state_bytes", static_cast<int64_t>(losses[r][2].item<double>())},
           {"parameter_fingerprint", distributed::fingerprint_text(static_cast<uint64_t>(fingerprints[r].item<int64_t>()))}});
    }
    if (options.save) report["saved"] = *options.save;
    if (options.json) {
      std::cout << printable_json(report, 2) << "\n";
    } else {
      std::cout << "train builtin:" << options.model << " on " << options.device << ", " << world
                << (world == 1 ? " rank" : " ranks") << ", " << to_string(options.mode) << ", steps " << start_step
                << ".." << options.steps << ", global batch " << options.global_batch << ", " << fixed(seconds, 2)
                << " s\n";
      std::cout << column("rank", 6) << column("first loss", 14) << column("last loss", 14)
                << column("optimizer state", 18) << "parameters\n";
      for (const auto& item : report["ranks"]) {
        std::cout << column(std::to_string(item["rank"].get<int>()), 6)
                  << column(scientific(item["first_loss"].get<double>()), 14)
                  << column(scientific(item["last_loss"].get<double>()), 14)
                  << column(format_bytes(item["optimizer_state_bytes"].get<int64_t>()), 18)
                  << item["parameter_fingerprint"].get<std::string>() << "\n";
      }
      std::cout << (identical ? "every rank ends with the same parameters\n"
                              : "the ranks' parameters differ: data parallel training went wrong\n");
      if (options.save) std::cout << "saved the training state to " << *options.save << "\n";
    }
  }
  return identical ? 0 : 1;
}

}  // namespace torchbridge::cli

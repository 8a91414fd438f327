// The distributed layer's contract with its launcher and with c10d, in one process: torchrun's
// environment read (or refused) variable by variable, a world of one without torchrun, and the
// errors for what cannot work (NCCL on a CPU-only torch, a rank 0 that never comes). Collectives
// across real processes run under torchrun (distributed_worker.cpp, CTest distributed.*).
#include <torchbridge/distributed/data_parallel.h>
#include <torchbridge/distributed/launch_environment.h>
#include <torchbridge/distributed/process_group.h>
#include <torchbridge/distributed/zero_optimizer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "error_message.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

using test_support::error_of;

using Variables = std::map<std::string, std::string>;

LaunchEnvironment read(const Variables& variables) {
  return read_launch_environment([&](const char* name) -> const char* {
    const auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  });
}

Variables torchrun_variables() {
  return {{"RANK", "3"},        {"WORLD_SIZE", "4"},          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29511"},
          {"TORCHELASTIC_RESTART_COUNT", "2"}, {"TORCHELASTIC_RUN_ID", "job-7"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

TEST(LaunchEnvironment, NoVariablesIsAWorldOfOne) {
  const LaunchEnvironment env = read({});
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
}

TEST(LaunchEnvironment, ReadsTorchrunsContract) {
  const LaunchEnvironment env = read(torchrun_variables());
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29511);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.run_id, "job-7");
  EXPECT_TRUE(env.agent_store);
}

TEST(LaunchEnvironment, EveryBadValueIsNamed) {
  const auto refused = [](const std::string& name, const std::string& value) {
    Variables variables = torchrun_variables();
    variables[name] = value;
    return error_of([&] { read(variables); });
  };
  for (const auto& [name, value, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"RANK", "x", "RANK 'x'"},
           {"RANK", "4", "RANK '4'"},  // outside a world of 4
           {"RANK", "-1", "RANK '-1'"},
           {"WORLD_SIZE", "0", "WORLD_SIZE '0'"},
           {"LOCAL_RANK", "2", "LOCAL_RANK '2'"},  // outside 2 local ranks
           {"LOCAL_WORLD_SIZE", "5", "LOCAL_WORLD_SIZE '5'"},  // more than the world
           {"MASTER_PORT", "70000", "MASTER_PORT '70000'"},
           {"MASTER_PORT", "", "MASTER_PORT ''"},
           {"MASTER_ADDR", "", "MASTER_ADDR is empty"},
           {"TORCHELASTIC_RESTART_COUNT", "-3", "TORCHELASTIC_RESTART_COUNT '-3'"},
           {"TORCHELASTIC_USE_AGENT_STORE", "yes", "TORCHELASTIC_USE_AGENT_STORE 'yes'"},
       }) {
    const std::string message = refused(name, value);
    EXPECT_NE(message.find(expected), std::string::npos) << name << "=" << value << ": " << message;
  }
}

TEST(LaunchEnvironment, APartialEnvironmentSaysWhatIsMissing) {
  Variables variables = torchrun_variables();
  variables.erase("MASTER_PORT");
  variables.erase("LOCAL_RANK");
  const std::string message = error_of([&] { read(variables); });
  EXPECT_NE(message.find("missing: LOCAL_RANK, MASTER_PORT"), std::string::npos) << message;
  EXPECT_NE(message.find("torchrun"), std::string::npos) << message;
}

TEST(ProcessGroup, AWorldOfOneRunsEveryCollectiveWithoutTorchrun) {
  const auto group = init(LaunchEnvironment{}, InitOptions{});
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->backend(), CollectiveBackend::gloo);
  const at::Tensor original = at::arange(6, at::kFloat);
  at::Tensor x = original.clone();
  group->all_reduce_sum(x);
  EXPECT_TRUE(at::equal(x, original));
  group->broadcast(x, 0);
  EXPECT_TRUE(at::equal(x, original));
  const auto gathered = group->all_gather(original);
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_TRUE(at::equal(gathered[0], original));
  group->barrier();
  group->refuse_together("a check", "");  // nothing refused: nothing raised
  EXPECT_EQ(error_of([&] { group->refuse_together("a check", "this rank refuses: reason"); }),
            "this rank refuses: reason");
  EXPECT_THROW(group->refuse_together("a check", "reason"), c10::ValueError);
  // Bad arguments are refused before any communication.
  EXPECT_NE(error_of([&] { group->broadcast(x, 1); }).find("broadcast root 1 is not a rank"), std::string::npos);
  at::Tensor undefined;
  EXPECT_NE(error_of([&] { group->all_reduce_sum(undefined); }).find("undefined tensor"), std::string::npos);
}

TEST(ProcessGroup, NcclIsRefusedWhereItCannotRunWithTheReasonAndTheWayOut) {
  EXPECT_NE(error_of([&] { parse_collective_backend("mpi"); }).find("'mpi' is not one of: gloo, nccl"),
            std::string::npos);
  InitOptions options;
  options.timeout = std::chrono::milliseconds(0);
  EXPECT_NE(error_of([&] { init(LaunchEnvironment{}, options); }).find("timeout must be positive"), std::string::npos);
  options.timeout = std::chrono::milliseconds(60'000);
  const std::string reason = nccl_unavailable_reason();
  if (reason.empty()) {
    // Where NCCL runs, it is still only for CUDA tensors.
    options.backend = CollectiveBackend::nccl;
    EXPECT_NE(error_of([&] { init(LaunchEnvironment{}, options); })
                  .find("the nccl collective backend reduces CUDA tensors, not device 'cpu'; use gloo"),
              std::string::npos);
    GTEST_SKIP() << "NCCL runs here: NcclWorldOfOneReducesCudaTensorsAndKeepsGlooForTheCpus tests it";
  }
  options.device = "cuda";  // its default backend is NCCL
  const std::string message = error_of([&] { init(LaunchEnvironment{}, options); });
  // The way out names what each API offers: Python and the CLI have no backend option.
  EXPECT_NE(message.find("the nccl collective backend is not available: " + reason +
                         "; Gloo reduces host tensors instead: train on device 'cpu' (Python and the CLI), or set "
                         "InitOptions::backend to gloo (C++)"),
            std::string::npos)
      << message;
}

// A world of one on this rank's GPU: CUDA tensors are reduced by NCCL, CPU tensors (every check
// the layer makes) still by Gloo, and DataParallel trains on the GPU with no host staging.
TEST(ProcessGroup, NcclWorldOfOneReducesCudaTensorsAndKeepsGlooForTheCpus) {
  const std::string reason = nccl_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << "NCCL cannot run here: " << reason;
  InitOptions options;
  options.device = "cuda";
  const auto group = init(LaunchEnvironment{}, options);
  EXPECT_EQ(group->backend(), CollectiveBackend::nccl);
  EXPECT_EQ(group->native()->getBackend(c10::DeviceType::CUDA)->getBackendName(), "nccl");
  EXPECT_EQ(group->native()->getBackend(c10::DeviceType::CPU)->getBackendName(), "gloo");

  at::Tensor on_cpu = at::arange(4, at::kFloat);
  group->all_reduce_sum(on_cpu);
  EXPECT_TRUE(at::equal(on_cpu, at::arange(4, at::kFloat)));
  std::vector<at::Tensor> on_gpu{at::arange(4, at::TensorOptions().dtype(at::kFloat).device(c10::kCUDA, 0))};
  group->native()->allreduce(on_gpu)->wait();
  EXPECT_TRUE(at::equal(on_gpu[0].cpu(), at::arange(4, at::kFloat)));

  torch::manual_seed(0);
  torch::nn::Linear trained(8, 4), reference(8, 4);
  {
    const at::NoGradGuard no_grad;
    reference->weight.copy_(trained->weight);
    reference->bias.copy_(trained->bias);
  }
  trained->to(c10::Device(c10::kCUDA, 0));
  reference->to(c10::Device(c10::kCUDA, 0));
  DataParallel parallel(*trained, group);
  const at::Tensor x = at::randn({5, 8}).to(c10::Device(c10::kCUDA, 0));
  parallel.backward(trained->forward(x).square().mean());
  reference->forward(x).square().mean().backward();
  EXPECT_TRUE(at::equal(trained->weight.grad().cpu(), reference->weight.grad().cpu()));  // the mean over one rank
  EXPECT_TRUE(at::equal(trained->bias.grad().cpu(), reference->bias.grad().cpu()));
}

// c10d's reducer buckets dense gradients only; a sparse embedding's failed inside backward with
// "Cannot access storage of SparseTensorImpl", naming nothing. Refused, named, at construction.
TEST(DataParallel, RefusesAModuleThatMakesSparseGradients) {
  const auto group = init(LaunchEnvironment{}, InitOptions{});
  torch::nn::Sequential model(torch::nn::Linear(2, 2),
                              torch::nn::Embedding(torch::nn::EmbeddingOptions(4, 2).sparse(true)));
  const std::string refused = error_of([&] { DataParallel parallel(*model, group); });
  EXPECT_NE(refused.find("DataParallel: module '1' makes sparse gradients (sparse=true)"), std::string::npos) << refused;
  torch::nn::Sequential dense(torch::nn::Linear(2, 2), torch::nn::Embedding(4, 2));
  EXPECT_NO_THROW(DataParallel(*dense, group));
}

// Gradients as bucket views, in a world of one (Gloo, the CPU): after each step every gradient
// equals plain backward's bit for bit, the gradients of parameters in one bucket share its
// storage, and zeroing them in place keeps them there step after step (nothing is copied back)
// once the reducer has rebuilt its buckets after the first step.
// Without the option the gradients are the parameters' own tensors.
TEST(DataParallel, GradientsAsBucketViewsShareTheBucketAndEqualPlainBackward) {
  const auto group = init(LaunchEnvironment{}, InitOptions{});
  torch::manual_seed(0);
  torch::nn::Linear first(16, 32), second(32, 8), reference_first(16, 32), reference_second(32, 8);
  {
    const at::NoGradGuard no_grad;
    reference_first->weight.copy_(first->weight);
    reference_first->bias.copy_(first->bias);
    reference_second->weight.copy_(second->weight);
    reference_second->bias.copy_(second->bias);
  }
  ModelTensors model;
  model.parameters = {{"first.weight", first->weight}, {"first.bias", first->bias},
                      {"second.weight", second->weight}, {"second.bias", second->bias}};
  DataParallelOptions options;
  options.gradient_as_bucket_view = true;
  DataParallel parallel(model, group, options);  // 5 KiB: one bucket

  const std::vector<at::Tensor> trained = {first->weight, first->bias, second->weight, second->bias};
  const std::vector<at::Tensor> reference = {reference_first->weight, reference_first->bias,
                                             reference_second->weight, reference_second->bias};
  const void* bucket = nullptr;
  for (int step = 0; step < 3; ++step) {
    for (const auto& p : trained) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    for (const auto& p : reference) p.mutable_grad().reset();
    const at::Tensor x = at::randn({4, 16});
    parallel.backward(second->forward(first->forward(x).relu()).square().mean());
    reference_second->forward(reference_first->forward(x).relu()).square().mean().backward();
    for (size_t i = 0; i < trained.size(); ++i) {
      EXPECT_TRUE(at::equal(trained[i].grad(), reference[i].grad())) << "parameter " << i << ", step " << step;
      EXPECT_TRUE(trained[i].grad().is_alias_of(trained[0].grad())) << "parameter " << i << " is not in the bucket";
    }
    // After the first step the reducer rebuilds its buckets once, in the order gradients arrived.
    const void* storage = trained[0].grad().storage().data();
    if (step == 1) bucket = storage;
    if (step > 1) {
      EXPECT_EQ(storage, bucket) << "step " << step << ": the gradients left their bucket";
    }
  }

  torch::nn::Linear alone(16, 8);
  ModelTensors plain;
  plain.parameters = {{"weight", alone->weight}, {"bias", alone->bias}};
  DataParallel without(plain, group);
  without.backward(alone->forward(at::randn({4, 16})).square().mean());
  EXPECT_FALSE(alone->weight.grad().is_alias_of(alone->bias.grad()));
}

// The consolidated state carries the hyperparameters the shard stepped with (a scheduler's lr),
// and loading one restores them into the shard and clears state the source does not have, as
// torch's ZeroRedundancyOptimizer does with its param_groups. Only the moments travelled before.
TEST(ZeroRedundancyOptimizer, StateCarriesTheHyperparametersAndNothingStale) {
  const auto group = init(LaunchEnvironment{}, InitOptions{});
  torch::manual_seed(0);
  torch::nn::Linear layer(4, 2);
  const auto adam = [](std::vector<at::Tensor> parameters) {
    return std::make_unique<torch::optim::Adam>(std::move(parameters), torch::optim::AdamOptions(0.1));
  };
  ZeroRedundancyOptimizer zero(layer->parameters(), group, adam);
  layer->forward(at::randn({3, 4})).sum().backward();
  zero.step();
  auto& shard_options = static_cast<torch::optim::AdamOptions&>(zero.local_optimizer()->param_groups()[0].options());
  shard_options.lr(0.025);  // as a scheduler sets it
  auto full = adam(layer->parameters());
  zero.consolidate_state_into(full.get(), 0);
  EXPECT_EQ(static_cast<torch::optim::AdamOptions&>(full->param_groups()[0].options()).lr(), 0.025);
  EXPECT_EQ(full->state().size(), 2u);

  auto fresh = adam(layer->parameters());
  static_cast<torch::optim::AdamOptions&>(fresh->param_groups()[0].options()).lr(0.5);
  zero.load_state_from(*fresh);  // a state without moments: the shard's must go too
  EXPECT_EQ(static_cast<torch::optim::AdamOptions&>(zero.local_optimizer()->param_groups()[0].options()).lr(), 0.5);
  EXPECT_TRUE(zero.local_optimizer()->state().empty());
}

// A port nobody listens on: bind one, note it, close it.
int unused_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

TEST(ProcessGroup, ARankZeroThatNeverComesIsATimeoutNamingTheAddress) {
  LaunchEnvironment env;
  env.launched = true;
  env.rank = 1;
  env.world_size = 2;
  env.local_world_size = 2;
  env.local_rank = 1;
  env.master_addr = "127.0.0.1";
  env.master_port = unused_port();
  InitOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  const std::string message = error_of([&] { init(env, options); });
  EXPECT_NE(message.find("rank 1 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("MASTER_ADDR 127.0.0.1, MASTER_PORT " + std::to_string(env.master_port)), std::string::npos)
      << message;
  EXPECT_NE(message.find("timeout 1500 ms"), std::string::npos) << message;
  EXPECT_EQ(message.find("frame #"), std::string::npos) << "a user-facing message, not a C++ backtrace";
}

}  // namespace
}  // namespace torchbridge::distributed

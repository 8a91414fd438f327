// Saving a training run on one backend and resuming it on another continues bit-identically to
// an uninterrupted run on the CPU: every parameter is compared after further steps.
#include <torchbridge/checkpoint/training_state.h>
#include <torchbridge/registry.h>

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/module_state.h>

#include "error_message.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

using test_support::error_of;

torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& type, torch::nn::Sequential& model) {
  if (type == "SGD") return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  if (type == "Adam") return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps, const c10::Device& device) {
  torch::manual_seed(99);
  const at::Tensor x = torch::randn({16, 6}).to(device), y = torch::randn({16, 2}).to(device);
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
}

struct Case {
  std::string optimizer;
  std::string save_on;
  std::string resume_on;
};

class TrainingState : public ::testing::TestWithParam<Case> {};

TEST_P(TrainingState, ResumesBitIdenticallyOnAnotherBackend) {
  const Case c = GetParam();
  const c10::Device save_device = create_backend(c.save_on)->device(0);
  const c10::Device resume_device = create_backend(c.resume_on)->device(0);
  const std::string path = ::testing::TempDir() + "state_" + c.optimizer + c.save_on + c.resume_on + ".safetensors";

  // Reference: 5 steps on the CPU, then 5 more, uninterrupted.
  auto reference = make_model(1);
  auto reference_optimizer = make_optimizer(c.optimizer, reference);
  train(reference, *reference_optimizer, 5, c10::Device(c10::kCPU));
  train(reference, *reference_optimizer, 5, c10::Device(c10::kCPU));

  // Interrupted: 5 steps on `save_on`, saved; a fresh model and optimizer restored on `resume_on`.
  auto first = make_model(1);
  first->to(save_device);
  auto first_optimizer = make_optimizer(c.optimizer, first);
  train(first, *first_optimizer, 5, save_device);
  save_training_state(path, *first, *first_optimizer, {5, 1, {{"run", "test"}}});

  auto resumed = make_model(7);  // different initial weights: everything must come from the file
  auto resumed_optimizer = make_optimizer(c.optimizer, resumed);
  RestoreOptions options;
  options.device_map = {{"", resume_device}};
  const TrainingProgress progress = load_training_state(path, *resumed, *resumed_optimizer, options);
  EXPECT_EQ(progress.step, 5);
  EXPECT_EQ(progress.epoch, 1);
  EXPECT_EQ(progress.user_metadata.at("run"), "test");
  for (const auto& p : resumed->parameters()) EXPECT_EQ(p.device(), resume_device);
  train(resumed, *resumed_optimizer, 5, resume_device);

  const auto expected = reference->named_parameters();
  for (const auto& item : resumed->named_parameters()) {
    const at::Tensor got = item.value().detach().cpu(), want = expected[item.key()].detach();
    EXPECT_TRUE(at::equal(got, want)) << item.key() << " differs after resuming (" << c.optimizer << ", "
                                      << c.save_on << " -> " << c.resume_on << "), max abs diff "
                                      << (got - want).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, TrainingState,
    ::testing::Values(Case{"SGD", "cpu", "emu"}, Case{"Adam", "cpu", "emu"}, Case{"AdamW", "cpu", "emu"},
                      Case{"SGD", "emu", "cpu"}, Case{"Adam", "emu", "cpu"}, Case{"AdamW", "emu", "cpu"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.optimizer + "_" + info.param.save_on + "_to_" + info.param.resume_on;
    });

// Device-map prefixes are module paths, as in Python and as the README says: "1" placed layer 10's
// tensors too (a plain string prefix), and a prefix that matched nothing moved nothing, silently.
TEST(TrainingStateDeviceMap, PrefixesAreModulePathsAndEachMustPlaceSomething) {
  const std::string path = ::testing::TempDir() + "state_device_map.safetensors";
  torch::manual_seed(3);
  torch::nn::Sequential model;
  for (int i = 0; i < 11; ++i) model->push_back(torch::nn::Linear(2, 2));  // layers "0" .. "10"
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  save_training_state(path, *model, optimizer, {});
  const auto emu_backend = create_backend("emu");
  const c10::Device cpu(c10::kCPU), emu = emu_backend->device(0);
  RestoreOptions options;
  options.device_map = {{"", cpu}, {"1", emu}};
  load_training_state(path, *model, optimizer, options);
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().device(), item.key().rfind("1.", 0) == 0 ? emu : cpu) << item.key();
  }
  options.device_map = {{"", cpu}, {"nothere", emu}};
  EXPECT_NE(error_of([&] { load_training_state(path, *model, optimizer, options); })
                .find("device_map entry 'nothere' matches no parameter or buffer of the model"),
            std::string::npos);
  // emu's free memory as it was: AutoSpreadsModulesOverDevicesByFreeMemory, later in this binary,
  // expects both devices equally free.
  model->to(cpu);
  emu_backend->empty_cache();
}

TEST(TrainingStateErrors, MismatchesAreNamed) {
  const std::string path = ::testing::TempDir() + "state_errors.safetensors";
  auto model = make_model(1);
  auto sgd = make_optimizer("SGD", model);
  train(model, *sgd, 1, c10::Device(c10::kCPU));
  save_training_state(path, *model, *sgd, {});
  auto adam = make_optimizer("Adam", model);
  EXPECT_NE(error_of([&] { load_training_state(path, *model, *adam); }).find("holds a SGD optimizer but a Adam"),
            std::string::npos);
  // The second layer's shape differs; the first layer (checked earlier) must not be touched either.
  torch::nn::Sequential other(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  auto other_sgd = make_optimizer("SGD", other);
  const at::Tensor untouched = other->parameters()[0].detach().clone();
  EXPECT_NE(error_of([&] { load_training_state(path, *other, *other_sgd); }).find("was saved with shape"),
            std::string::npos);
  EXPECT_TRUE(at::equal(other->parameters()[0], untouched)) << "a failed restore partially loaded the model";
}

// A copy of the training state at `path` with its tensors and metadata edited, as a truncated or
// crafted file would be.
std::string rewritten(const std::string& path, const std::string& name,
                      const std::function<void(NamedTensors&, std::map<std::string, std::string>&)>& edit) {
  const auto file = SafetensorsFile::open(path);
  NamedTensors tensors;
  for (const auto& record : file.tensors()) tensors.emplace_back(record.name, file.load(record.name).clone());
  auto metadata = file.metadata();
  edit(tensors, metadata);
  const std::string out = ::testing::TempDir() + name;
  save(out, tensors, metadata);
  return out;
}

struct SavedRun {
  std::string path;
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

// An Adam run of 3 steps saved to `name`, and a differently trained model + optimizer to restore into.
std::pair<std::string, SavedRun> saved_adam_run(const std::string& name) {
  auto model = make_model(1);
  auto adam = make_optimizer("Adam", model);
  train(model, *adam, 3, c10::Device(c10::kCPU));
  const std::string path = ::testing::TempDir() + name;
  save_training_state(path, *model, *adam, {7, 1, {}});
  SavedRun target{path, make_model(2), nullptr};
  target.optimizer = make_optimizer("Adam", target.model);
  train(target.model, *target.optimizer, 2, c10::Device(c10::kCPU));
  return {path, std::move(target)};
}

// Every parameter and every optimizer state tensor, bitwise, to show nothing changed.
std::vector<at::Tensor> snapshot(const SavedRun& run) {
  std::vector<at::Tensor> out;
  for (const auto& p : run.model->parameters()) out.push_back(p.detach().clone());
  for (const auto& [impl, state] : run.optimizer->state()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*state);
    out.push_back(s.exp_avg().clone());
    out.push_back(at::scalar_tensor(s.step(), at::kLong));
  }
  return out;
}

bool unchanged(const std::vector<at::Tensor>& before, const SavedRun& run) {
  const auto after = snapshot(run);
  if (after.size() != before.size()) return false;
  for (size_t i = 0; i < before.size(); ++i) {
    if (!at::equal(before[i], after[i])) return false;
  }
  return true;
}

// A missing metadata key was undefined behaviour (operator[] on a const JSON / map .at without a
// check); now it is an error naming the file and the key, and nothing changes.
TEST(TrainingStateErrors, MissingMetadataKeysAreNamedAndChangeNothing) {
  // Named members, not a structured binding: the lambdas below capture them (clang < 16 refuses
  // to capture structured bindings).
  auto saved = saved_adam_run("state_metadata.safetensors");
  const std::string& path = saved.first;
  SavedRun& run = saved.second;
  const auto before = snapshot(run);
  for (const std::string key : {"torchbridge.step", "torchbridge.epoch", "torchbridge.optimizer"}) {
    const std::string truncated =
        rewritten(path, "state_without_key.safetensors", [&](NamedTensors&, auto& metadata) { metadata.erase(key); });
    const std::string error = error_of([&] { load_training_state(truncated, *run.model, *run.optimizer); });
    EXPECT_NE(error.find(truncated), std::string::npos) << error;
    EXPECT_NE(error.find("has no '" + key + "'"), std::string::npos) << error;
    EXPECT_TRUE(unchanged(before, run)) << key;
  }
  const auto broken = [&](const std::string& key, const std::string& value, const std::string& expected) {
    const std::string crafted =
        rewritten(path, "state_crafted.safetensors", [&](NamedTensors&, auto& metadata) { metadata[key] = value; });
    const std::string error = error_of([&] { load_training_state(crafted, *run.model, *run.optimizer); });
    EXPECT_NE(error.find(expected), std::string::npos) << key << "=" << value << ": " << error;
    EXPECT_TRUE(unchanged(before, run)) << key << "=" << value;
  };
  broken("torchbridge.step", "7x", "metadata 'torchbridge.step' '7x' is not a whole number");
  broken("torchbridge.optimizer", "{\"type\": \"Adam\"", "'torchbridge.optimizer' is not JSON");
  broken("torchbridge.optimizer", "{\"type\": \"RMSprop\", \"groups\": []}",
         "names optimizer 'RMSprop'; TorchBridge restores SGD, Adam, AdamW");
  broken("torchbridge.optimizer", "{\"type\": \"Adam\", \"groups\": [{\"lr\": 0.1}]}",
         "group 0 has no number 'beta1'");
  broken("torchbridge.optimizer", "{\"type\": \"Adam\", \"groups\": []}",
         "the state has 0 parameter groups but the optimizer has 1");
}

// The model was replaced before the optimizer state was read, so a bad optimizer tensor left a
// half-restored run. Now everything is read and checked first.
TEST(TrainingStateErrors, AFailingOptimizerLoadLeavesModelAndOptimizerUntouched) {
  // Named members, not a structured binding: the lambdas below capture them (clang < 16 refuses
  // to capture structured bindings).
  auto saved = saved_adam_run("state_bad_optimizer.safetensors");
  const std::string& path = saved.first;
  SavedRun& run = saved.second;
  const auto before = snapshot(run);
  const std::string wrong_shape = rewritten(path, "state_wrong_moment.safetensors", [](NamedTensors& tensors, auto&) {
    for (auto& [name, tensor] : tensors) {
      if (name == "optimizer.2.exp_avg") tensor = at::zeros({3, 3});
    }
  });
  const std::string error = error_of([&] { load_training_state(wrong_shape, *run.model, *run.optimizer); });
  EXPECT_NE(error.find("optimizer state 'optimizer.2.exp_avg' has shape [3, 3] but its parameter has [2, 8]"),
            std::string::npos)
      << error;
  EXPECT_TRUE(unchanged(before, run)) << "a failed optimizer load changed the model or the optimizer";
  const std::string bad_rng = rewritten(path, "state_bad_rng.safetensors", [](NamedTensors& tensors, auto&) {
    for (auto& [name, tensor] : tensors) {
      if (name == "rng.cpu") tensor = tensor.slice(0, 0, 16).clone();
    }
  });
  EXPECT_NE(error_of([&] { load_training_state(bad_rng, *run.model, *run.optimizer); })
                .find("generator state 'rng.cpu' has 16 elements"),
            std::string::npos);
  EXPECT_TRUE(unchanged(before, run));
  // The intact file still restores, and the step count comes back.
  EXPECT_EQ(load_training_state(path, *run.model, *run.optimizer).step, 7);
  EXPECT_FALSE(unchanged(before, run));
}

// A GradScaler's and an LR scheduler's state ride in the progress: saved when set, returned by a
// restore exactly (the scale as a double, the scheduler's JSON byte for byte), absent when unset.
TEST(TrainingStateProgress, GradScalerAndSchedulerStatesRoundTrip) {
  auto model = make_model(1);
  auto adam = make_optimizer("Adam", model);
  train(model, *adam, 2, c10::Device(c10::kCPU));
  const std::string path = ::testing::TempDir() + "state_scaler.safetensors";
  TrainingProgress progress{3, 0, {}};
  progress.grad_scaler = amp::GradScalerState{1.0 / 3.0 * 65536.0, 2.0, 0.5, 2000, 17};
  progress.lr_scheduler = R"({"last_epoch": 3, "best": {"__float__": "inf"}, "_last_lr": [0.001]})";
  save_training_state(path, *model, *adam, progress);
  const TrainingProgress restored = load_training_state(path, *model, *adam);
  ASSERT_TRUE(restored.grad_scaler.has_value());
  EXPECT_EQ(restored.grad_scaler->scale, progress.grad_scaler->scale);  // bitwise: JSON keeps doubles exactly
  EXPECT_EQ(restored.grad_scaler->growth_interval, 2000);
  EXPECT_EQ(restored.grad_scaler->growth_tracker, 17);
  EXPECT_EQ(restored.lr_scheduler, progress.lr_scheduler);

  const std::string plain = ::testing::TempDir() + "state_plain.safetensors";
  save_training_state(plain, *model, *adam, {3, 0, {}});
  const TrainingProgress without = load_training_state(plain, *model, *adam);
  EXPECT_FALSE(without.grad_scaler.has_value());
  EXPECT_TRUE(without.lr_scheduler.empty());
}

TEST(TrainingStateErrors, MalformedScalerOrSchedulerStatesAreNamedAndChangeNothing) {
  // Named members, not a structured binding: the lambdas below capture them (clang < 16 refuses
  // to capture structured bindings).
  auto saved = saved_adam_run("state_extras.safetensors");
  const std::string& path = saved.first;
  SavedRun& run = saved.second;
  const auto before = snapshot(run);
  const auto broken = [&](const std::string& key, const std::string& value, const std::string& expected) {
    const std::string crafted =
        rewritten(path, "state_crafted_extras.safetensors", [&](NamedTensors&, auto& metadata) { metadata[key] = value; });
    const std::string error = error_of([&] { load_training_state(crafted, *run.model, *run.optimizer); });
    EXPECT_NE(error.find(expected), std::string::npos) << key << "=" << value << ": " << error;
    EXPECT_TRUE(unchanged(before, run)) << key << "=" << value;
  };
  broken("torchbridge.grad_scaler", "{\"scale\": 2.0", "'torchbridge.grad_scaler' is not JSON");
  broken("torchbridge.grad_scaler", "[1, 2]", "'torchbridge.grad_scaler' is not a JSON object but array");
  broken("torchbridge.grad_scaler",
         R"({"scale": "big", "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 0})",
         "'scale' is \"big\", expected a number");
  broken("torchbridge.grad_scaler",
         R"({"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2.5, "_growth_tracker": 0})",
         "'growth_interval' is 2.5, expected an integer");
  broken("torchbridge.grad_scaler", R"({"scale": 2.0})", "has 1 entries; a GradScaler state has scale");
  broken("torchbridge.lr_scheduler", "last_epoch=3", "'torchbridge.lr_scheduler' is not JSON");

  TrainingProgress progress{1, 0, {}};
  progress.lr_scheduler = "[1, 2]";
  const std::string target = ::testing::TempDir() + "state_bad_scheduler.safetensors";
  const std::string error = error_of([&] { save_training_state(target, *run.model, *run.optimizer, progress); });
  EXPECT_NE(error.find("TrainingProgress::lr_scheduler is not a JSON object: '[1, 2]'"), std::string::npos) << error;
}

TEST(TrainingStateErrors, AnUnsupportedOptimizerIsNamed) {
  auto model = make_model(1);
  torch::optim::RMSprop rmsprop(model->parameters(), torch::optim::RMSpropOptions(0.01));
  const std::string error =
      error_of([&] { save_training_state(::testing::TempDir() + "rms.safetensors", *model, rmsprop, {}); });
  EXPECT_NE(error.find("supports the optimizers SGD, Adam, AdamW; this one's options are torch::optim::RMSpropOptions"),
            std::string::npos)
      << error;
}

TEST(TrainingStateDevices, AutoSpreadsModulesOverDevicesByFreeMemory) {
  const auto emu = create_backend("emu");  // two devices with equal free memory
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                              torch::nn::Linear(64, 64));
  auto sgd = make_optimizer("SGD", model);
  const std::string path = ::testing::TempDir() + "state_auto.safetensors";
  save_training_state(path, *model, *sgd, {});
  torch::nn::Sequential restored(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                                 torch::nn::Linear(64, 64));
  auto restored_sgd = make_optimizer("SGD", restored);
  RestoreOptions options;
  options.auto_backend = "emu";
  load_training_state(path, *restored, *restored_sgd, options);
  const auto params = restored->named_parameters();
  EXPECT_EQ(params["0.weight"].device(), emu->device(0));
  EXPECT_EQ(params["1.weight"].device(), emu->device(0));
  EXPECT_EQ(params["2.weight"].device(), emu->device(1));
  EXPECT_EQ(params["3.bias"].device(), emu->device(1));
  EXPECT_TRUE(at::equal(params["3.weight"].cpu(), model->named_parameters()["3.weight"]));
}

// A tensor at the model's root (a class token, a learned scale) is placed as a module's are; it
// once stayed where it was, splitting the model between the CPU and the devices.
struct ModelWithARootTensor : torch::nn::Module {
  ModelWithARootTensor() {
    scale = register_parameter("scale", torch::ones({64}));
    body = register_module("body", torch::nn::Linear(64, 64));
  }
  at::Tensor scale;
  torch::nn::Linear body{nullptr};
};

TEST(TrainingStateDevices, AutoPlacesTensorsAtTheModelsRoot) {
  const auto emu = create_backend("emu");
  auto model = std::make_shared<ModelWithARootTensor>();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string path = ::testing::TempDir() + "state_root.safetensors";
  save_training_state(path, *model, sgd, {});
  auto restored = std::make_shared<ModelWithARootTensor>();
  torch::optim::SGD restored_sgd(restored->parameters(), torch::optim::SGDOptions(0.1));
  RestoreOptions options;
  options.auto_backend = "emu";
  load_training_state(path, *restored, restored_sgd, options);
  for (const auto& item : restored->named_parameters()) {
    EXPECT_EQ(item.value().device().type(), emu->device(0).type())
        << item.key() << " stayed on " << item.value().device();
  }
}

// An fp8 weight and its dequantization factor, stored as `weight<suffix>`. Both names hold the
// factor (DeepSeek-V3 and transformers' fine-grained FP8 call it _scale_inv and multiply by it).
struct Fp8Layer : torch::nn::Module {
  Fp8Layer(const std::string& suffix, const at::Tensor& factor) {
    torch::manual_seed(3);
    weight = register_buffer("weight", torch::randn({4, 4}).to(at::kFloat8_e4m3fn));
    register_buffer("weight" + suffix, factor.clone());
  }
  at::Tensor weight;
};

TEST(TrainingStateDtypes, Fp8WidensMultipliedByItsStoredFactorWhereTheTargetLacksFp8) {
  const auto cpu = create_backend("cpu");
  const auto& dtypes = cpu->info(0).supported_dtypes;
  if (std::find(dtypes.begin(), dtypes.end(), at::kFloat8_e4m3fn) != dtypes.end()) GTEST_SKIP() << "the CPU holds fp8";
  const bool bf16 = std::find(dtypes.begin(), dtypes.end(), at::kBFloat16) != dtypes.end();
  torch::optim::SGD optimizer(std::vector<at::Tensor>{torch::zeros({1}, torch::requires_grad())},
                              torch::optim::SGDOptions(0.1));
  const std::string path = ::testing::TempDir() + "state_fp8.safetensors";
  const at::Tensor block = torch::tensor({0.5, 0.25, 2.0, 4.0}).reshape({2, 2});
  // Per tensor, per row, and per 2x2 block of the 4x4 weight, each with the factor per element.
  const std::vector<std::pair<at::Tensor, at::Tensor>> factors = {
      {torch::full({1}, 0.25), torch::full({4, 4}, 0.25)},
      {torch::tensor({0.5, 0.25, 2.0, 4.0}).reshape({4, 1}),
       torch::tensor({0.5, 0.25, 2.0, 4.0}).reshape({4, 1}).expand({4, 4})},
      {block, block.repeat_interleave(2, 0).repeat_interleave(2, 1)}};
  for (const std::string suffix : {"_scale", "_scale_inv"}) {
    for (const auto& [factor, per_element] : factors) {
      SCOPED_TRACE("weight" + suffix + " of shape " + c10::str(factor.sizes()));
      auto saved = std::make_shared<Fp8Layer>(suffix, factor);
      save_training_state(path, *saved, optimizer, {});
      auto restored = std::make_shared<Fp8Layer>(suffix, factor);
      RestoreOptions options;
      options.dtype_policy = DtypePolicy::kConvertUnsupported;
      load_training_state(path, *restored, optimizer, options);
      const at::Tensor weight = restored->named_buffers()["weight"];
      EXPECT_EQ(weight.scalar_type(), bf16 ? at::kBFloat16 : at::kFloat);
      const at::Tensor expected = (saved->weight.to(at::kFloat) * per_element).to(weight.scalar_type());
      EXPECT_TRUE(at::equal(weight, expected)) << "fp8 values must be multiplied by their stored factor";
      // The model's factor, which its forward applies, was restored as saved: outputs scaled twice.
      EXPECT_TRUE(at::equal(restored->named_buffers()["weight" + suffix], torch::ones_like(factor)))
          << "the factor the widened values absorbed must become 1";
    }
  }
  auto mismatched = std::make_shared<Fp8Layer>("_scale_inv", torch::ones({3, 3}));
  save_training_state(path, *mismatched, optimizer, {});
  RestoreOptions options;
  options.dtype_policy = DtypePolicy::kConvertUnsupported;
  EXPECT_NE(error_of([&] { load_training_state(path, *mismatched, optimizer, options); })
                .find("cannot dequantize 'model.weight' of shape [4, 4] with 'model.weight_scale_inv' of shape [3, 3]"),
            std::string::npos);
  EXPECT_EQ(mismatched->weight.scalar_type(), at::kFloat8_e4m3fn) << "a refused load changes nothing";
}

TEST(TrainingStateDtypes, PoliciesCastOrKeep) {
  const std::string path = ::testing::TempDir() + "state_dtypes.safetensors";
  auto model = make_model(1);
  auto sgd = make_optimizer("SGD", model);
  save_training_state(path, *model, *sgd, {});
  auto restored = make_model(2);
  auto restored_sgd = make_optimizer("SGD", restored);
  RestoreOptions cast;
  cast.dtype_policy = DtypePolicy::kCastFloating;
  cast.cast_to = at::kDouble;
  load_training_state(path, *restored, *restored_sgd, cast);
  for (const auto& p : restored->parameters()) EXPECT_EQ(p.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(restored->parameters()[0].to(at::kFloat), model->parameters()[0]));
}

}  // namespace
}  // namespace torchbridge::checkpoint

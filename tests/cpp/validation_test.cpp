// The C++ Validator on torch::nn and TorchScript models, its metrics against hand computations,
// checks that must fail on wrong models, and bad input. (Faulty emu runtimes: test_validation.py.)
#include "error_message.h"
#include "validation/comparison.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/registry.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/precision.h>
#include <torchbridge/validation/validator.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace torchbridge::validation {
namespace {

using test_support::error_of;

std::vector<CheckRecord> of(const ValidationReport& report, const std::string& backend, const std::string& check) {
  std::vector<CheckRecord> out;
  for (const auto& c : report.checks) {
    if (c.backend == backend && check_name(c.check) == check) out.push_back(c);
  }
  return out;
}

TEST(ValidationMetrics, MatchHandComputedValues) {
  const at::Tensor reference = torch::tensor({3.0, -4.0, 0.0}, torch::kDouble);
  const at::Tensor result = torch::tensor({3.0f, -4.5f, 0.0f});
  const Comparison c = compare(result, reference);
  EXPECT_DOUBLE_EQ(c.metrics.max_abs_error, 0.5);
  EXPECT_DOUBLE_EQ(c.metrics.max_rel_error, 0.5 / 4.0);
  EXPECT_DOUBLE_EQ(c.metrics.rel_l2_error, 0.5 / 5.0);
  EXPECT_NEAR(c.metrics.cosine_similarity, (9.0 + 18.0) / (5.0 * std::sqrt(9.0 + 20.25)), 1e-15);
  const Bound loose{0, 0.2, 0.99}, tight{0, 0.05, 0.99};
  EXPECT_TRUE(within(c, loose));
  EXPECT_FALSE(within(c, tight));
  // NaN never passes; two zero tensors are identical in direction.
  EXPECT_FALSE(within(compare(torch::tensor({NAN, 1.0f}), torch::tensor({0.0f, 1.0f})), Bound{1e9, 1e9, -1}));
  EXPECT_DOUBLE_EQ(compare(torch::zeros({3}), torch::zeros({3})).metrics.cosine_similarity, 1.0);
  // A NaN reference makes the relative errors NaN (unknown), not infinite.
  const Comparison nan_reference = compare(torch::tensor({1.0, 2.0}), torch::tensor({std::nan(""), 2.0}, torch::kDouble));
  EXPECT_TRUE(std::isnan(nan_reference.metrics.max_rel_error));
  EXPECT_TRUE(std::isnan(nan_reference.metrics.rel_l2_error));
}

TEST(ValidationMetrics, ANoiseLevelReferenceIsJudgedByTheErrorNormAlone) {
  // A gradient that is zero in exact arithmetic (a bias just before batch norm): float64 leaves
  // 1e-16, float32 5e-8 per element, pointing anywhere. Within atol, the cosine does not count.
  const at::Tensor reference = torch::full({32}, 1.5e-16, torch::kDouble);
  const at::Tensor result = torch::full({32}, -5e-8, torch::kFloat);
  const Bound fp32_gradient = spec_of(Precision::kFp32).gradient;
  const Comparison noise = compare(result, reference);
  EXPECT_LT(noise.metrics.cosine_similarity, 0);
  EXPECT_FALSE(direction_is_checked(noise, fp32_gradient));
  EXPECT_TRUE(within(noise, fp32_gradient));
  // Above the absolute tolerance the direction is checked again, and NaN still fails.
  const Comparison flipped = compare(torch::full({32}, -1e-6, torch::kFloat), torch::full({32}, 1e-6, torch::kDouble));
  EXPECT_TRUE(direction_is_checked(flipped, Bound{1e-7, 1e9, 0.5}));
  EXPECT_FALSE(within(flipped, Bound{1e-7, 1e9, 0.5}));
  EXPECT_FALSE(within(compare(torch::full({32}, NAN), reference), fp32_gradient));
}

TEST(ValidationMetrics, NoiseThatCancelledIsAllowedToScaleWithTheModelsGradients) {
  // The bias of a Linear before a training-mode BatchNorm, on the CPU in fp32 against float64:
  // 7.35e-7 of noise where atol x sqrt(8) allows 2.8e-7, with the model's gradients of order 1e-2
  // per element. The noise follows the size of the values that cancelled, not the tolerance.
  const at::Tensor reference = torch::full({8}, 2e-16, torch::kDouble);
  const at::Tensor result = torch::full({8}, 2.6e-7, torch::kFloat);
  const Bound fp32_gradient = spec_of(Precision::kFp32).gradient;
  const Comparison noise = compare(result, reference);
  EXPECT_FALSE(within(noise, fp32_gradient));
  EXPECT_TRUE(within(noise, fp32_gradient, /*noise_rms=*/1e-2));
  // A real error there is as large as the gradients themselves, far outside rtol of them.
  EXPECT_FALSE(within(compare(torch::full({8}, 5e-3, torch::kFloat), reference), fp32_gradient, 1e-2));
  // A reference that is no noise gets nothing more.
  const Comparison real = compare(torch::full({8}, 1.1f, torch::kFloat), torch::full({8}, 1.0, torch::kDouble));
  EXPECT_DOUBLE_EQ(allowed_error_norm(real, fp32_gradient, 1e3), allowed_error_norm(real, fp32_gradient));
}

TEST(ValidationMetrics, IntegersAreComparedExactlyAndComplexNumbersWhole) {
  // Token ids off by 5 in 512 passed a bound relative to the ids' norm.
  at::Tensor ids = torch::arange(512, torch::kLong) * 97;
  at::Tensor other = ids.clone();
  other[3] += 5;
  const Bound fp32_output = spec_of(Precision::kFp32).output;
  const Comparison differing = compare(other, ids);
  EXPECT_TRUE(differing.exact);
  EXPECT_EQ(differing.differing, 1);
  EXPECT_FALSE(within(differing, fp32_output));
  EXPECT_TRUE(within(compare(ids.clone(), ids), fp32_output));
  EXPECT_FALSE(within(compare(torch::tensor({true, false}), torch::tensor({true, true})), Bound{1e9, 1e9, -1}));
  // An imaginary part 1.5x too large passed: the comparison read the real parts only.
  const at::Tensor z = torch::complex(torch::ones({4}, torch::kDouble), torch::ones({4}, torch::kDouble));
  const at::Tensor off = torch::complex(torch::ones({4}), torch::full({4}, 1.5f));
  EXPECT_FALSE(within(compare(off, z), fp32_output));
  EXPECT_NEAR(compare(off, z).error_norm, 1.0, 1e-12);  // sqrt(4 x 0.5^2)
  EXPECT_TRUE(within(compare(z.to(torch::kComplexFloat), z), fp32_output));
}

TEST(ValidationTolerances, TableHasEveryPrecisionAndRejectsUnknownOnes) {
  for (const char* name : {"fp64", "fp32", "tf32", "fp16", "bf16", "fp8"}) {
    const PrecisionSpec& row = spec_of(parse_precision(name));
    EXPECT_STREQ(row.name, name);
    EXPECT_GT(row.output.rtol, 0) << name;
    EXPECT_GE(row.gradient.rtol, row.output.rtol) << name;
  }
  EXPECT_LT(spec_of(Precision::kFp32).output.rtol, spec_of(Precision::kBf16).output.rtol);
  // Each row says what it computes in and keeps parameters in: fp8 is weight-only.
  EXPECT_EQ(spec_of(Precision::kFp8).compute, at::kBFloat16);
  EXPECT_EQ(spec_of(Precision::kFp8).storage, at::kFloat8_e4m3fn);
  EXPECT_TRUE(spec_of(Precision::kTf32).tf32_matmuls);
  EXPECT_EQ(spec_of(Precision::kTf32).compute, at::kFloat);
  const std::string unknown = error_of([] { parse_precision("int4"); });
  EXPECT_NE(unknown.find("unknown precision 'int4': expected one of fp64, fp32, tf32, fp16, bf16, fp8"),
            std::string::npos) << unknown;
  EXPECT_NE(error_of([] { validation_precision("tf32"); }).find("cannot be validated on its own"), std::string::npos);
  // torch's names of the plain formats, where users may type either; tf32 and fp8 have none.
  EXPECT_EQ(validation_precision("bfloat16"), Precision::kBf16);
  EXPECT_EQ(parse_precision_or_dtype_name("float64"), Precision::kFp64);
  EXPECT_EQ(parse_precision_or_dtype_name("float32"), Precision::kFp32);
  EXPECT_EQ(parse_precision_or_dtype_name("float16"), Precision::kFp16);
  EXPECT_NE(error_of([] { parse_precision("float16"); }).find("unknown precision 'float16'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_precision_or_dtype_name("float8_e4m3fn"); })
                .find("(or torch's dtype names float64, float32, float16, bfloat16)"),
            std::string::npos);
}

TEST(ValidationChecks, KindsRoundTripThroughTheirReportNames) {
  for (const auto kind : {CheckKind::kRun, CheckKind::kOutput, CheckKind::kGradient, CheckKind::kFinite,
                          CheckKind::kDeterminism, CheckKind::kRoundTrip, CheckKind::kMemory}) {
    EXPECT_EQ(parse_check_kind(check_name(kind)), kind) << check_name(kind);
  }
  EXPECT_STREQ(check_name(CheckKind::kRoundTrip), "round_trip");
  const std::string unknown = error_of([] { parse_check_kind("speed"); });
  EXPECT_NE(unknown.find("unknown check 'speed': expected one of run, output, gradient"), std::string::npos) << unknown;
}

// A user's torch::nn module as the C++ API documents them: Cloneable, with a typed forward.
struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(6, 12));
    fc2 = register_module("fc2", torch::nn::Linear(12, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

TEST(Validator, TorchNnModuleIsValidOnCpuAndEmu) {
  torch::manual_seed(0);
  Net net;
  const Validator validator({{"cpu", "emu"}, Precision::kFp32});
  const auto report = validator.validate(*model_from(torch::nn::AnyModule(net)), std::vector<std::vector<int64_t>>{{5, 6}});
  EXPECT_TRUE(report.is_valid());
  EXPECT_EQ(report.model_kind, "torch::nn");
  EXPECT_EQ(report.reference, "cpu float64");
  EXPECT_EQ(of(report, "emu", "gradient").size(), 4u);  // two weights, two biases
  ASSERT_EQ(of(report, "emu", "memory").size(), 1u);
  EXPECT_TRUE(of(report, "emu", "memory")[0].passed);
  // On an SDK device both windows are measured: the second run, and the whole validation.
  EXPECT_NE(of(report, "emu", "memory")[0].detail.find("across the second run"), std::string::npos);
  EXPECT_NE(of(report, "emu", "memory")[0].detail.find("from before placing"), std::string::npos);
  EXPECT_TRUE(net->parameters()[0].device().is_cpu());  // the source is untouched
  // The device's checks are made before the comparisons (which wait for the reference) but are
  // reported in reading order.
  std::vector<std::string> order;
  for (const auto& c : report.checks) {
    if (c.backend == "emu" && (order.empty() || order.back() != check_name(c.check))) order.push_back(check_name(c.check));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"output", "gradient", "finite", "determinism", "round_trip", "memory"}));
}

// The reference is computed on a thread of its own while the backends run. The reference's first
// run (the only copy placed in float64) and the backend's first run each wait for the other to
// have started: only a validator that runs the two at once lets both see the other; one that ran
// them one after the other, in either order, would make one side wait out the timeout. It also
// records the thread that placed the reference's copy: the calling thread must (a model that
// lives on a device is copied from it, and a backend's memory window must not see that).
class ReferenceAndDeviceMeet final : public ModelSource {
 public:
  explicit ReferenceAndDeviceMeet(std::unique_ptr<ModelSource> inner) : inner_(std::move(inner)) {}
  std::string kind() const override { return inner_->kind(); }
  std::unique_ptr<PlacedModel> place(c10::Device device, c10::ScalarType dtype,
                                     std::optional<c10::ScalarType> round_through) const override {
    const bool reference = dtype == at::kDouble;
    if (reference) {
      const std::lock_guard<std::mutex> lock(mutex_);
      reference_placed_on_ = std::this_thread::get_id();
    }
    return std::make_unique<Signalling>(inner_->place(device, dtype, round_through), *this, reference);
  }
  bool both_met() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return reference_saw_the_device_ && device_saw_the_reference_;
  }
  std::thread::id reference_placed_on() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return reference_placed_on_;
  }

 private:
  // Only the first arrival on each side waits (the backend runs more than once).
  void arrive_and_wait_for(bool& mine, const bool& theirs, bool& saw_theirs) const {
    std::unique_lock<std::mutex> lock(mutex_);
    if (mine) return;
    mine = true;
    met_.notify_all();
    saw_theirs = met_.wait_for(lock, std::chrono::seconds(20), [&] { return theirs; });
  }
  void arrive(bool reference) const {
    if (reference) {
      arrive_and_wait_for(reference_started_, device_started_, reference_saw_the_device_);
    } else {
      arrive_and_wait_for(device_started_, reference_started_, device_saw_the_reference_);
    }
  }

  class Signalling final : public PlacedModel {
   public:
    Signalling(std::unique_ptr<PlacedModel> inner, const ReferenceAndDeviceMeet& source, bool reference)
        : inner_(std::move(inner)), source_(source), reference_(reference) {}
    RunResult run(const std::vector<at::Tensor>& inputs, const OutputWeights& weights) override {
      source_.arrive(reference_);
      return inner_->run(inputs, weights);
    }
    std::unique_ptr<PlacedModel> save_and_reload() const override {
      return std::make_unique<Signalling>(inner_->save_and_reload(), source_, reference_);
    }

   private:
    std::unique_ptr<PlacedModel> inner_;
    const ReferenceAndDeviceMeet& source_;
    bool reference_;
  };

  std::unique_ptr<ModelSource> inner_;
  mutable std::mutex mutex_;
  mutable std::condition_variable met_;
  mutable bool reference_started_ = false, device_started_ = false;
  mutable bool reference_saw_the_device_ = false, device_saw_the_reference_ = false;
  mutable std::thread::id reference_placed_on_;
};

TEST(Validator, ComputesTheReferenceWhileTheBackendRuns) {
  const ReferenceAndDeviceMeet source(model_from(make_builtin_model("mlp")));
  const auto report = Validator({{"cpu"}, Precision::kFp32})
                          .validate(source, std::vector<std::vector<int64_t>>{builtin_model_info("mlp").input_shape});
  EXPECT_TRUE(source.both_met());
  EXPECT_TRUE(report.is_valid());
  EXPECT_EQ(report.reference, "cpu float64");
  EXPECT_EQ(source.reference_placed_on(), std::this_thread::get_id());
}

// Counts the forward passes that run with grad mode on; copies share the count.
struct CountingNetImpl : torch::nn::Cloneable<CountingNetImpl> {
  explicit CountingNetImpl(std::shared_ptr<std::atomic<int>> calls) : calls(std::move(calls)) { reset(); }
  void reset() override { fc = register_module("fc", torch::nn::Linear(6, 3)); }
  at::Tensor forward(const at::Tensor& x) {
    if (at::GradMode::is_enabled()) ++*calls;
    return fc(x);
  }
  torch::nn::Linear fc{nullptr};
  std::shared_ptr<std::atomic<int>> calls;
};
TORCH_MODULE(CountingNet);

// --checkpointing really trains through the recomputation: every forward pass with gradients runs
// once more during backward, on every device, the reference included.
TEST(Validator, CheckpointedTrainingRecomputesEveryTrainingForwardPass) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  torch::manual_seed(0);
  CountingNet net(calls);
  const auto source = model_from(torch::nn::AnyModule(net));
  ValidatorOptions options{{"cpu", "emu"}, Precision::kFp32};
  const auto plain = Validator(options).validate(*source, std::vector<std::vector<int64_t>>{{5, 6}});
  const int plain_calls = calls->exchange(0);
  options.checkpointing = true;
  const auto checkpointed = Validator(options).validate(*source, std::vector<std::vector<int64_t>>{{5, 6}});
  EXPECT_TRUE(plain.is_valid());
  EXPECT_TRUE(checkpointed.is_valid());
  EXPECT_FALSE(plain.checkpointing);
  EXPECT_TRUE(checkpointed.checkpointing);
  // Five forward passes without checkpointing: the reference's, and on each backend its first run
  // and the forward-only repeat. With it, the three training runs (the reference's and each
  // backend's first) are recomputed once each in backward; the repeat runs no backward.
  EXPECT_EQ(plain_calls, 5);
  EXPECT_EQ(calls->load(), plain_calls + 3);
}

TEST(Validator, BuiltinTorchScriptModelsAreValidInEveryPrecision) {
  const auto emu = create_backend("emu");
  for (const auto& info : builtin_models()) {
    for (const Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16, Precision::kFp8}) {
      const Validator validator({{"cpu", "emu"}, precision});
      const auto report = validator.validate(*model_from(make_builtin_model(info.name)),
                                             std::vector<std::vector<int64_t>>{info.input_shape});
      EXPECT_TRUE(report.is_valid()) << info.name << " " << name_of(precision) << ": " << report.failed() << " failed";
    }
  }
}

TEST(Validator, BuiltinModelsAreReproducibleFromTheirSeed) {
  const auto a = make_builtin_model("cnn", 7), b = make_builtin_model("cnn", 7), c = make_builtin_model("cnn", 8);
  const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  EXPECT_TRUE(torch::equal(*pa.begin(), *pb.begin()));
  EXPECT_FALSE(torch::equal(*pa.begin(), *pc.begin()));
  EXPECT_NE(error_of([] { make_builtin_model("resnet"); }).find("unknown built-in model 'resnet'"), std::string::npos);
}

// A model that computes something else off the CPU must fail; a check that cannot fail is a defect.
TEST(Validator, DeviceDependentTorchScriptFailsTheOutputCheck) {
  torch::jit::Module m("DeviceDependent");
  m.register_parameter("w", torch::ones({4}).set_requires_grad(true), false);
  m.define(R"(
def forward(self, x):
  y = x * self.w
  if y.device.type == "cpu":
    return y
  return y * 1.0001
)");
  const auto report = Validator({{"cpu", "emu"}, Precision::kFp32}).validate(*model_from(m), std::vector<std::vector<int64_t>>{{3, 4}});
  EXPECT_FALSE(report.is_valid());
  EXPECT_TRUE(of(report, "cpu", "output")[0].passed);
  ASSERT_TRUE(of(report, "emu", "output")[0].metrics);
  EXPECT_FALSE(of(report, "emu", "output")[0].passed);
  EXPECT_NEAR(of(report, "emu", "output")[0].metrics->rel_l2_error, 1e-4, 1e-6);
}

TEST(Validator, NanOutputsFailTheFiniteCheck) {
  torch::jit::Module m("Log");
  m.register_parameter("w", torch::ones({4}).set_requires_grad(true), false);
  m.define("def forward(self, x):\n  return torch.log(x * self.w)\n");  // negative inputs give NaN
  const auto report = Validator({{"cpu"}, Precision::kFp32}).validate(*model_from(m), std::vector<std::vector<int64_t>>{{8, 4}});
  EXPECT_FALSE(of(report, "cpu", "finite")[0].passed);
  EXPECT_FALSE(of(report, "cpu", "output")[0].passed);  // NaN never compares within tolerance
}

TEST(Validator, BadInputIsRefusedBeforeAnyReport) {
  EXPECT_NE(error_of([] { Validator({{"cpu", "nope"}, Precision::kFp32}); }).find("unknown backend 'nope'"), std::string::npos);
  EXPECT_NE(error_of([] { Validator({{"cpu"}, validation_precision("int8")}); }).find("precision 'int8'"),
            std::string::npos);
  EXPECT_NE(error_of([] { Validator({{"cpu"}, Precision::kTf32}); }).find("does not run tf32"), std::string::npos);
  EXPECT_NE(error_of([] { Validator({{}, Precision::kFp32}); }).find("no backends"), std::string::npos);
  const auto mlp = make_builtin_model("mlp");
  const std::string wrong = error_of([&] {
    Validator({{"cpu"}, Precision::kFp32}).validate(*model_from(mlp), std::vector<std::vector<int64_t>>{{4, 7}});
  });
  EXPECT_NE(wrong.find("does not run on the CPU with inputs of shape [4, 7]"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << wrong;
  EXPECT_NE(error_of([] { parse_shape("4,-1"); }).find("bad entry '-1'"), std::string::npos);
  EXPECT_EQ(parse_shape("4,16,32"), (std::vector<int64_t>{4, 16, 32}));
}

// An SDK device and a native accelerator cannot share a process for autograd; the Validator says
// so before loading or running anything (the names alone decide, so this holds on any machine).
TEST(Validator, AnSdkDeviceBesideANativeAcceleratorIsRefusedBeforeLoading) {
  // Run in one process after other tests, emu may already be loaded; what this test loads is not.
  const bool loaded_before = registered_privateuse1_device().has_value();
  const std::string error = error_of([] { Validator({{"cpu", "cuda", "emu"}, Precision::kFp32}); });
  EXPECT_NE(error.find("cannot validate on SDK device 'emu' and native accelerator 'cuda' in one process"),
            std::string::npos)
      << error;
  if (!loaded_before) {
    EXPECT_FALSE(registered_privateuse1_device().has_value()) << "the refusal must come before emu is loaded";
  }
}

TEST(ValidationReportJson, ReadsBackWhatItWrote) {
  const auto transformer = make_builtin_model("transformer");
  const ValidationReport written = Validator({{"cpu"}, Precision::kFp32}).validate(
      *model_from(transformer), std::vector<std::vector<int64_t>>{builtin_model_info("transformer").input_shape});
  const ValidationReport read = report_from_json(report_json(written));
  EXPECT_EQ(read.model_kind, written.model_kind);
  EXPECT_EQ(read.reference, written.reference);
  EXPECT_EQ(read.backends, written.backends);
  ASSERT_EQ(read.checks.size(), written.checks.size());
  for (size_t i = 0; i < read.checks.size(); ++i) {
    EXPECT_EQ(read.checks[i].subject, written.checks[i].subject);
    EXPECT_EQ(read.checks[i].passed, written.checks[i].passed);
    EXPECT_EQ(read.checks[i].metrics.has_value(), written.checks[i].metrics.has_value());
    if (read.checks[i].metrics) {
      EXPECT_DOUBLE_EQ(read.checks[i].metrics->rel_l2_error, written.checks[i].metrics->rel_l2_error);
    }
  }
  EXPECT_EQ(read.not_checked, written.not_checked);
  ASSERT_EQ(read.timings.size(), 1u);
  EXPECT_EQ(read.timings[0].backend, "cpu");
  EXPECT_NE(error_of([] { report_from_json("{\"schema\": \"other\"}"); }).find("not a validation report"),
            std::string::npos);
  EXPECT_NE(error_of([] { report_from_json("[1,"); }).find("does not parse"), std::string::npos);
}

}  // namespace
}  // namespace torchbridge::validation

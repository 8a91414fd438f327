// GradScaler unit behaviour: defaults, scaling, skipping on inf/NaN, backoff and growth, the errors
// torch raises for misuse, argument checks and state. Values are checked against arithmetic done
// here (powers of two, exact in float32); tests/python/test_amp.py compares whole runs with
// torch.amp.GradScaler bit for bit.
#include <torchbridge/amp/grad_scaler.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "expect_error.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::amp {
namespace {

using test_support::expect_error;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One parameter p (three ones) under SGD(lr=1); the loss sum(2p) gives every gradient 2 * scale.
struct Training {
  explicit Training(c10::Device device = c10::kCPU)
      : parameter(at::ones({3}, at::TensorOptions().device(device)).set_requires_grad(true)),
        optimizer(std::vector<at::Tensor>{parameter}, torch::optim::SGDOptions(1.0)) {}

  void backward(GradScaler& scaler, std::optional<double> poison = std::nullopt) {
    optimizer.zero_grad();
    scaler.scale((parameter * 2).sum()).backward();
    if (poison) parameter.grad().select(0, 1).fill_(*poison);
  }
  // One iteration: returns whether the optimizer stepped.
  bool iterate(GradScaler& scaler, std::optional<double> poison = std::nullopt) {
    backward(scaler, poison);
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    return stepped;
  }

  at::Tensor parameter;
  torch::optim::SGD optimizer;
};

TEST(GradScaler, DefaultsAreTorchs) {
  GradScaler scaler;
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  const auto state = scaler.state_dict();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->scale, 65536.0);
  EXPECT_EQ(state->growth_interval, 2000);
}

TEST(GradScaler, ScaleMultipliesByTheScaleOnTheOutputsDevice) {
  GradScaler scaler({.init_scale = 8.0});
  const at::Tensor loss = at::full({}, 1.5);
  const at::Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.item<float>(), 12.0f);
  const auto both = scaler.scale(std::vector<at::Tensor>{loss, at::full({2}, 0.25)});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[1][0].item<float>(), 2.0f);
}

TEST(GradScaler, ACleanStepUnscalesAndSteps) {
  GradScaler scaler;
  Training run;
  run.backward(scaler);
  EXPECT_EQ(run.parameter.grad()[0].item<float>(), 2.0f * 65536.0f);
  scaler.unscale_(run.optimizer);
  EXPECT_TRUE(at::equal(run.parameter.grad(), at::full({3}, 2.0f)));
  EXPECT_TRUE(scaler.step(run.optimizer));
  EXPECT_TRUE(at::equal(run.parameter.detach(), at::full({3}, -1.0f)));  // 1 - lr * 2
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, AnInfOrNaNSkipsTheStepAndBacksOff) {
  for (const double poison : {kInf, -kInf, kNaN}) {
    GradScaler scaler;
    Training run;
    EXPECT_FALSE(run.iterate(scaler, poison));
    EXPECT_TRUE(at::equal(run.parameter.detach(), at::ones({3})));  // untouched
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanStepsAndAnInfResetsTheCount) {
  GradScaler scaler({.init_scale = 4.0, .growth_interval = 3});
  Training run;
  run.iterate(scaler);
  run.iterate(scaler);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  run.iterate(scaler, kInf);  // backoff, count restarts
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) run.iterate(scaler);
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, NaNInEveryStepBacksOffEveryStep) {
  // As torch: every update after a skipped step multiplies the scale by backoff_factor, with no
  // floor, and no step is ever taken.
  GradScaler scaler;
  Training run;
  for (int i = 1; i <= 40; ++i) {
    EXPECT_FALSE(run.iterate(scaler, kNaN));
    EXPECT_EQ(scaler.get_scale(), static_cast<double>(std::ldexp(1.0f, 16 - i))) << "step " << i;
  }
  EXPECT_TRUE(at::equal(run.parameter.detach(), at::ones({3})));
}

TEST(GradScaler, MisuseRaisesTorchsErrors) {
  GradScaler scaler;
  Training run;
  expect_error([&] { scaler.update(); }, "Attempted update but _scale is None.  This may indicate your script did not "
                                         "use scaler.scale(loss or outputs) earlier in the iteration.");
  expect_error([&] { scaler.step(run.optimizer); }, "Attempted step but _scale is None.");
  expect_error([&] { scaler.unscale_(run.optimizer); }, "Attempted unscale_ but _scale is None.");
  run.backward(scaler);
  expect_error([&] { scaler.update(); }, "No inf checks were recorded prior to update.");
  scaler.unscale_(run.optimizer);
  expect_error([&] { scaler.unscale_(run.optimizer); },
               "unscale_() has already been called on this optimizer since the last update().");
  scaler.step(run.optimizer);
  expect_error([&] { scaler.step(run.optimizer); }, "step() has already been called since the last update().");
  expect_error([&] { scaler.unscale_(run.optimizer); }, "unscale_() is being called after step().");
  scaler.update();
  EXPECT_NO_THROW(run.iterate(scaler));  // update() starts a fresh iteration
}

TEST(GradScaler, AssertionsAreTheirOwnType) {
  GradScaler scaler;
  EXPECT_THROW(scaler.update(), GradScalerAssertion);
}

TEST(GradScaler, Fp16GradientsAreRefused) {
  GradScaler scaler;
  Training run;
  run.backward(scaler);
  run.parameter.mutable_grad() = run.parameter.grad().to(at::kHalf);
  expect_error([&] { scaler.step(run.optimizer); }, "Attempting to unscale FP16 gradients.");
}

TEST(GradScaler, UpdateToANewScale) {
  GradScaler scaler;
  Training run;
  run.backward(scaler);
  scaler.step(run.optimizer);
  scaler.update(1024.0);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  run.backward(scaler);
  scaler.step(run.optimizer);
  scaler.update(at::full({}, 8.0f));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  expect_error([&] { scaler.update(at::full({2}, 8.0f)); }, "new_scale should be a float or a 1-element");
  expect_error([&] { scaler.update(at::full({}, 8.0f).set_requires_grad(true)); }, "requires_grad=False");
  expect_error([&] { scaler.update(-1.0); }, "new_scale must be a finite number > 0, got -1");
  expect_error([&] { scaler.update(1e39); }, "new_scale must be a finite number > 0, got 1e+39 (the scale is float32");
}

TEST(GradScaler, NonsenseOptionsAreRefusedNamingValueAndRange) {
  expect_error([] { GradScaler({.init_scale = 0.0}); }, "init_scale must be a finite number > 0, got 0");
  expect_error([] { GradScaler({.init_scale = -2.0}); }, "init_scale must be a finite number > 0, got -2");
  expect_error([] { GradScaler({.init_scale = kInf}); }, "init_scale must be a finite number > 0, got inf");
  // The scale is float32: 1e-46 became 0 (parameters NaN after a step), 1e39 infinity.
  expect_error([] { GradScaler({.init_scale = 1e-46}); }, "got 1e-46 (the scale is float32, which holds about");
  expect_error([] { GradScaler({.init_scale = 1e39}); }, "got 1e+39 (the scale is float32, which holds about");
  expect_error([] { GradScaler({.growth_factor = 1.0}); }, "growth_factor must be a finite number > 1.0, got 1");
  expect_error([] { GradScaler({.backoff_factor = 1.0}); }, "backoff_factor must be in (0, 1), got 1");
  expect_error([] { GradScaler({.backoff_factor = 0.0}); }, "backoff_factor must be in (0, 1), got 0");
  expect_error([] { GradScaler({.growth_interval = 0}); }, "growth_interval must be an integer >= 1, got 0");
  GradScaler scaler;
  expect_error([&] { scaler.set_growth_factor(0.5); }, "growth_factor must be a finite number > 1.0, got 0.5");
  expect_error([&] { scaler.set_backoff_factor(2.0); }, "backoff_factor must be in (0, 1), got 2");
  expect_error([&] { scaler.set_growth_interval(-3); }, "growth_interval must be an integer >= 1, got -3");
  EXPECT_THROW(GradScaler({.growth_interval = 0}), c10::ValueError);
  // Like torch, a disabled scaler does not check its arguments; its getters report them (they
  // read 0, an impossible growth factor).
  EXPECT_NO_THROW(GradScaler({.growth_factor = 0.5, .enabled = false}));
  const GradScaler disabled({.enabled = false});
  EXPECT_EQ(disabled.get_growth_factor(), 2.0);
  EXPECT_EQ(disabled.get_backoff_factor(), 0.5);
  EXPECT_EQ(disabled.get_growth_interval(), 2000);
}

TEST(GradScaler, StateRoundTripsAndBadStatesChangeNothing) {
  GradScaler trained({.init_scale = 16.0, .growth_interval = 5});
  Training run;
  run.iterate(trained);
  run.iterate(trained);
  const auto state = trained.state_dict();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->scale, 16.0);
  EXPECT_EQ(state->growth_tracker, 2);

  GradScaler fresh;
  fresh.load_state_dict(state);  // before any scale(): becomes the initial values
  EXPECT_EQ(fresh.get_scale(), 16.0);
  EXPECT_EQ(fresh.growth_tracker(), 2);
  EXPECT_EQ(fresh.get_growth_interval(), 5);
  Training other;
  for (int i = 0; i < 3; ++i) other.iterate(fresh);  // 2 + 3 clean steps reach the interval
  EXPECT_EQ(fresh.get_scale(), 32.0);

  GradScalerState bad = *state;
  bad.backoff_factor = 1.5;
  expect_error([&] { fresh.load_state_dict(bad); }, "backoff_factor must be in (0, 1), got 1.5");
  bad = *state;
  bad.growth_tracker = -1;
  expect_error([&] { fresh.load_state_dict(bad); }, "_growth_tracker must be an integer in [0, ");
  EXPECT_EQ(fresh.get_scale(), 32.0);
  expect_error([&] { fresh.load_state_dict(std::nullopt); }, "The source state dict is empty");
}

TEST(GradScaler, DisabledPassesEverythingThrough) {
  GradScaler scaler({.enabled = false});
  Training run;
  const at::Tensor loss = at::full({}, 3.0);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  EXPECT_TRUE(run.iterate(scaler, kInf));  // no inf check: the step runs
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_FALSE(scaler.state_dict().has_value());
  EXPECT_NO_THROW(scaler.load_state_dict(std::nullopt));
}

TEST(GradScaler, OnEmuTheScaleAndFoundInfLiveOnTheDeviceAndResultsMatchTheCpu) {
  sdk::load_device("emu");
  if (const auto why = sdk::autograd_refusal()) GTEST_SKIP() << *why;  // one gtest process, after a CPU backward
  const c10::Device emu("emu:0");
  GradScaler on_emu({.init_scale = 4.0, .growth_interval = 2}), on_cpu({.init_scale = 4.0, .growth_interval = 2});
  Training emu_run(emu), cpu_run;
  const std::vector<std::optional<double>> poisons = {std::nullopt, kInf, std::nullopt, std::nullopt, kNaN, std::nullopt};
  for (const auto& poison : poisons) {
    EXPECT_EQ(emu_run.iterate(on_emu, poison), cpu_run.iterate(on_cpu, poison));
    EXPECT_EQ(on_emu.get_scale(), on_cpu.get_scale());
  }
  EXPECT_EQ(emu_run.parameter.device(), emu);
  EXPECT_TRUE(at::equal(emu_run.parameter.detach().cpu(), cpu_run.parameter.detach()));
}

}  // namespace
}  // namespace torchbridge::amp

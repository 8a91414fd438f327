// The C++ half of the GradScaler comparison in tests/python/test_amp.py: a scripted mixed-precision
// run with torch::optim and torchbridge::amp::GradScaler, whose scale trajectory, skipped steps and
// final parameters pytest compares bit for bit with the same run under torch.amp.GradScaler.
//   grad_scaler_interop DEVICE IN OUT INIT_SCALE GROWTH_INTERVAL
// IN (safetensors): w1 [8,4], b1 [8], w2 [2,8], b2 [2] (initial weights), x [16,4], y [16,2], and
// poison [steps, 4] (float32: 0 leaves parameter j's gradient alone, anything else is written into
// its first element after backward — inf or NaN). Model: linear(w1,b1) - tanh - linear(w2,b2), MSE
// loss; SGD with momentum 0.9 in two groups, {w1,b1} at lr 0.1 and {w2,b2} at lr 0.05.
// OUT (safetensors): the final w1, b1, w2, b2; scales [steps+1] (before the first step and after
// every update, float32), stepped [steps] and trackers [steps] (int32).
#include <torchbridge/amp/grad_scaler.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/sdk/device.h>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using torchbridge::amp::GradScaler;
using torchbridge::amp::GradScalerOptions;

int run(const std::string& device_name, const std::string& in, const std::string& out, double init_scale,
        int64_t growth_interval) {
  if (device_name != "cpu") torchbridge::sdk::load_device(device_name);
  const c10::Device device(device_name == "cpu" ? std::string("cpu") : device_name + ":0");
  const auto file = torchbridge::checkpoint::SafetensorsFile::open(in);
  const char* const names[] = {"w1", "b1", "w2", "b2"};
  std::vector<at::Tensor> params;
  for (const char* name : names) params.push_back(file.load(name, device).clone().set_requires_grad(true));
  const at::Tensor x = file.load("x", device), y = file.load("y", device);
  const at::Tensor poison = file.load("poison").contiguous();

  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]},
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).momentum(0.9)));
  groups.emplace_back(std::vector<at::Tensor>{params[2], params[3]},
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05).momentum(0.9)));
  torch::optim::SGD optimizer(std::move(groups), torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler scaler(GradScalerOptions{.init_scale = init_scale, .growth_interval = growth_interval});

  const int64_t steps = poison.size(0);
  std::vector<float> scales{static_cast<float>(scaler.get_scale())};
  std::vector<int32_t> stepped, trackers;
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    const at::Tensor hidden = at::tanh(at::linear(x, params[0], params[1]));
    const at::Tensor loss = at::mse_loss(at::linear(hidden, params[2], params[3]), y);
    scaler.scale(loss).backward();
    for (size_t j = 0; j < params.size(); ++j) {
      const float value = poison[step][static_cast<int64_t>(j)].item<float>();
      if (value != 0) params[j].grad().view(-1)[0].fill_(value);
    }
    stepped.push_back(scaler.step(optimizer) ? 1 : 0);
    scaler.update();
    scales.push_back(static_cast<float>(scaler.get_scale()));
    trackers.push_back(static_cast<int32_t>(scaler.growth_tracker()));
  }

  std::vector<std::pair<std::string, at::Tensor>> results;
  for (size_t j = 0; j < params.size(); ++j) results.emplace_back(names[j], params[j].detach().cpu());
  const auto as_tensor = [](const auto& values, at::ScalarType dtype) {
    return at::from_blob(const_cast<void*>(static_cast<const void*>(values.data())),
                         {static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(dtype))
        .clone();
  };
  results.emplace_back("scales", as_tensor(scales, at::kFloat));
  results.emplace_back("stepped", as_tensor(stepped, at::kInt));
  results.emplace_back("trackers", as_tensor(trackers, at::kInt));
  torchbridge::checkpoint::save(out, results);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DEVICE IN OUT INIT_SCALE GROWTH_INTERVAL\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3], std::stod(argv[4]), std::stoll(argv[5]));
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "grad_scaler_interop: %s\n", e.msg().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grad_scaler_interop: %s\n", e.what());
  }
  return 1;
}

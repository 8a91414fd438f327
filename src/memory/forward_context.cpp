// Capturing and replaying a checkpointed region's random and autocast state (forward_context.h).
#include "forward_context.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <array>
#include <mutex>

namespace torchbridge::memory::detail {
namespace {

GeneratorState state_of(at::Generator generator) {  // a handle: copies share the generator
  std::lock_guard<std::mutex> lock(generator.mutex());
  return {generator, generator.get_state()};
}

void set_state(const GeneratorState& recorded) {
  at::Generator generator = recorded.generator;
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(recorded.state);
}

// Every device type torch 2.13 has an autocast dispatch key for; unavailable ones are skipped.
constexpr std::array<c10::DeviceType, 9> kAutocastDeviceTypes = {
    c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::XPU, c10::DeviceType::MPS,
    c10::DeviceType::HPU, c10::DeviceType::XLA,  c10::DeviceType::IPU, c10::DeviceType::MTIA,
    c10::DeviceType::PrivateUse1};

}  // namespace

std::vector<GeneratorState> capture_random_state(const std::vector<at::Tensor>& inputs) {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  for (const at::Tensor& input : inputs) {
    if (!input.defined() || input.device().is_cpu()) continue;
    if (std::find(devices.begin(), devices.end(), input.device()) == devices.end()) devices.push_back(input.device());
  }
  std::vector<GeneratorState> states;
  for (const c10::Device& device : devices) {
    states.push_back(state_of(at::globalContext().defaultGenerator(device)));
  }
  return states;
}

RandomStateReplay::RandomStateReplay(const std::vector<GeneratorState>& recorded) {
  for (const GeneratorState& state : recorded) current_.push_back(state_of(state.generator));
  for (const GeneratorState& state : recorded) set_state(state);
}

RandomStateReplay::~RandomStateReplay() {
  for (const GeneratorState& state : current_) set_state(state);
}

AutocastState capture_autocast_state() {
  AutocastState state;
  for (c10::DeviceType device_type : kAutocastDeviceTypes) {
    if (!at::autocast::is_autocast_available(device_type)) continue;
    state.settings.push_back({device_type, at::autocast::is_autocast_enabled(device_type),
                              at::autocast::get_autocast_dtype(device_type)});
  }
  state.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return state;
}

std::vector<std::unique_ptr<amp::AutocastScope>> replay_autocast_state(const AutocastState& recorded) {
  std::vector<std::unique_ptr<amp::AutocastScope>> scopes;
  for (const AutocastSetting& setting : recorded.settings) {
    if (!setting.enabled && !at::autocast::is_autocast_enabled(setting.device_type)) continue;
    scopes.push_back(std::make_unique<amp::AutocastScope>(
        setting.device_type, amp::AutocastOptions{setting.dtype, setting.enabled, recorded.cache_enabled}));
  }
  return scopes;
}

}  // namespace torchbridge::memory::detail

// Whether PyTorch's autograd engine serves the SDK device just registered. The engine sizes its
// per-device queues once, when it starts its device threads (at the process's first backward
// pass), from the devices registered then, and a backward pass on a device index beyond them
// fails inside PyTorch with an internal assertion. torch has no call that says whether the
// threads were started, so the engine is made to start them now: a no-op where the first
// backward pass already did (with the queues it sized then), and otherwise a start with this
// device counted, which the first backward pass would have done anyway. Either way the queues
// then exist and are counted. (Starting them does not wait for Python's GIL: torch's Python
// engine counts each device thread as started before that thread takes the GIL.)
#include "sdk/autograd_probe.h"

#include <c10/core/Device.h>
#include <torch/csrc/autograd/engine.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>  // the engine's queues

namespace torchbridge::sdk {
namespace {

// The engine's queue vector is a protected member; a pointer to it, named through a derived
// class, reads it on the engine instance (standard C++; nothing is constructed from this class).
struct EngineQueues final : torch::autograd::Engine {
  static size_t count(const torch::autograd::Engine& engine) {
    return (engine.*(&EngineQueues::device_ready_queues_)).size();
  }
};

}  // namespace

std::optional<std::string> autograd_cannot_serve(const std::string& name, int device_count) {
  torch::autograd::Engine& engine = torch::autograd::Engine::get_default_engine();
  engine.initialize_device_threads_pool();
  const size_t queues = EngineQueues::count(engine);
  if (queues >= static_cast<size_t>(device_count)) return std::nullopt;
  const std::string which =
      queues == 0 ? "on '" + name + "'"
                  : "on " + c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(queues)).str() +
                        " and above";
  return "SDK device '" + name + "' was loaded after this process's first backward pass: PyTorch's autograd engine "
         "sized its per-device queues then, for " + std::to_string(queues) + " device(s), so a backward pass " +
         which + " would fail inside PyTorch (an internal assertion in autograd/engine.cpp). Forward passes work. "
         "To train on '" + name + "', load it before the first backward pass (first thing in the program), or "
         "train in a separate process";
}

}  // namespace torchbridge::sdk

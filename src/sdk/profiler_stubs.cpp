// The device half of torch's profiler for the SDK device. In its PrivateUse1 fallback mode
// (torch.autograd.profiler.profile(use_device=NAME), torch's legacy profiler and the one
// redirection hands `use_cuda=True`), torch brackets every operator with two events from these
// stubs on the current stream and reports the time between them as the operator's device time,
// as it does with CUDA events. Without them torch fails in every profiler callback ("PrivateUse1
// used in profiler but not enabled"), prints a C++ stack per operator and trips an internal
// assertion.
#include "sdk/registration.h"
#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <functional>
#include <memory>

namespace torchbridge::sdk {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

int32_t current_device() {
  int32_t device = 0;
  TB_CALL(get_device, &device);
  return device;
}

tb_event event_of(const ProfilerVoidEventStub* stub) { return static_cast<tb_event>(stub->get()); }

class SdkProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const int32_t index = current_device();
    if (device != nullptr) *device = static_cast<c10::DeviceIndex>(index);
    const tb_event created = runtime().create_event(index, /*enable_timing=*/1);
    // The profiler keeps these events in its result until it is destroyed: destroyed there, as
    // the allocator's are (a failure warns; never in a forked child, whose runtime is gone).
    *event = std::shared_ptr<void>(created, [](void* stale) {
      if (!in_bad_fork()) TB_CALL_OR_WARN(event_destroy, static_cast<tb_event>(stale));
    });
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    TB_CALL(event_record, created, native_stream(current_stream(static_cast<c10::DeviceIndex>(index))));
  }

  // Microseconds, as torch's CUDA stubs answer; waits for both events like them.
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    TB_CALL(event_synchronize, event_of(start));
    TB_CALL(event_synchronize, event_of(end));
    float milliseconds = 0;
    TB_CALL(event_elapsed_time, event_of(start), event_of(end), &milliseconds);
    return milliseconds * 1000.0F;
  }

  // Named ranges and marks are for an external tracer (NVTX for CUDA); the runtime interface has
  // no tracer to hand them to, and torch's own record keeps the operator names regardless.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const int32_t previous = current_device();
    const int count = runtime().device_count();
    try {
      for (int device = 0; device < count; ++device) {
        TB_CALL(set_device, device);
        op(device);
      }
    } catch (...) {
      TB_CALL_OR_WARN(set_device, previous);
      throw;
    }
    TB_CALL(set_device, previous);
  }

  void synchronize() const override { TB_CALL(device_synchronize, current_device()); }
};

}  // namespace

void register_profiler_stubs() {
  static SdkProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
}

}  // namespace torchbridge::sdk

// Google TPUs are driven through torch_xla, a Python package; the C++ library cannot reach them.
// The backend exists so that the name resolves and says where TPUs are served.
#include "backends/adapters.h"

#include <c10/util/Exception.h>

#include <memory>
#include <string>

namespace torchbridge::adapters {
namespace {

constexpr const char* kReason =
    "served by the Python package through torch_xla; the C++ library cannot drive TPUs";

class TpuBackend final : public Backend {
 public:
  std::string name() const override { return "tpu"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::XLA; }
  Availability availability() const override { return {AvailabilityStatus::kPythonOnly, kReason}; }
  int device_count() const override { return 0; }

  // check_device_index() raises with kReason for every call below.
  DeviceInfo info(int index) const override { check_device_index(index); return {}; }
  MemoryStats memory_stats(int index) const override { check_device_index(index); return {}; }
  void reset_peak_memory_stats(int index) override { check_device_index(index); }
  void empty_cache() override { check_available(); }
  void synchronize(int index) override { check_device_index(index); }
  c10::Stream current_stream(int index) const override { return c10::Stream(c10::Stream::DEFAULT, device(index)); }
  c10::Stream new_stream(int index) const override { return c10::Stream(c10::Stream::DEFAULT, device(index)); }
  c10::Event new_event(bool) const override {
    check_available();
    return c10::Event(c10::DeviceType::XLA);
  }
};

}  // namespace

std::shared_ptr<Backend> make_tpu_backend() { return std::make_shared<TpuBackend>(); }

}  // namespace torchbridge::adapters

#pragma once
// The one interface every accelerator is driven through. Features (precision, checkpoints,
// validation, ...) talk to hardware only through this class and c10's device-generic types.

#include <torchbridge/device_info.h>
#include <torchbridge/memory_stats.h>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Stream.h>

#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchbridge {

// How far prepare_model goes (docs/optimization.md): O0 places the model on the device and nothing
// else; O1 adds precision-neutral rewrites, O2 mixed precision and compilation, O3 FP8 and
// inference transforms.
enum class OptLevel { O0, O1, O2, O3 };
std::string to_string(OptLevel level);
// Parses "O0".."O3" (case-insensitive); anything else raises naming the valid levels.
OptLevel parse_opt_level(const std::string& text);

// What prepare_model leaves to the caller. A LibTorch module's forward is compiled code that no
// library can wrap, so where the level and precision use autocast (O2+ below float32; an eval
// module's weights are then cast to this dtype, and take inputs only through autocast), the
// program runs forward inside torchbridge::amp::AutocastScope(backend.device_type(), *autocast_dtype).
struct PreparedModel {
  std::optional<c10::ScalarType> autocast_dtype;  // nullopt: forward runs as it is
};

class Backend;
// How prepare_model applies O1-O3. Core cannot call the optimize layer above it, so that layer
// installs its implementation when libtorchbridge loads (src/optimize/model_preparer.cpp), the
// way the device SDK installs the registry's name resolver.
using ModelPreparer = PreparedModel (*)(const Backend& backend, torch::nn::Module& module, OptLevel level, int index);
void set_model_preparer(ModelPreparer preparer);

// Why a backend can or cannot be used in this process.
enum class AvailabilityStatus {
  kAvailable,
  kNotCompiled,     // the installed torch was built without this backend
  kNoDevice,        // compiled in, but no device was found
  kDriverError,     // compiled in, the vendor driver/runtime reported an error
  kNotRegistered,   // PrivateUse1: no device has been registered in this process
  kPythonOnly,      // served by the Python package (TPU through torch_xla)
};
std::string to_string(AvailabilityStatus status);

struct Availability {
  AvailabilityStatus status = AvailabilityStatus::kNoDevice;
  std::string reason;  // empty when available; otherwise a sentence a user can act on
  bool available() const { return status == AvailabilityStatus::kAvailable; }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Canonical name ("cuda", "rocm", "xpu", "mps", "tpu", "cpu", or the PrivateUse1 device name).
  virtual std::string name() const = 0;
  virtual c10::DeviceType device_type() const = 0;
  virtual Availability availability() const = 0;
  bool is_available() const { return availability().available(); }
  // Counts as an accelerator worth preferring over the CPU in detect_best_backend().
  virtual bool is_real_hardware() const { return true; }

  // Number of devices this process can use; 0 when unavailable.
  virtual int device_count() const = 0;
  // The torch device for `index`; raises when the backend is unavailable or the index is out of range.
  virtual c10::Device device(int index = 0) const;

  virtual DeviceInfo info(int index = 0) const = 0;
  virtual MemoryStats memory_stats(int index = 0) const = 0;
  virtual void reset_peak_memory_stats(int index = 0) = 0;
  // Returns cached, unused memory to the driver / operating system.
  virtual void empty_cache() = 0;
  // Blocks until all work queued on device `index` has finished.
  virtual void synchronize(int index = 0) = 0;

  virtual c10::Stream current_stream(int index = 0) const = 0;
  virtual c10::Stream new_stream(int index = 0) const = 0;
  virtual c10::Event new_event(bool enable_timing = false) const = 0;

  // Places `module` on device `index` and applies the optimizations of `level`: O1-O3 run the
  // optimize layer's UnifiedManager with this backend, precision "auto" and the module's own
  // training mode (include <torchbridge/optimize/manager.h> for the report and other settings).
  // Returns what the caller must apply itself: the autocast its forward must run under.
  // (Not [[nodiscard]]: at O0 and O1 there is nothing to apply, and the call stays a statement.)
  PreparedModel prepare_model(torch::nn::Module& module, OptLevel level = OptLevel::O0, int index = 0) const;

 protected:
  // Raises with the reason unless the backend is available.
  void check_available() const;
  // Raises unless the backend is available and 0 <= index < device_count().
  void check_device_index(int index) const;
};

}  // namespace torchbridge

#pragma once
// The one interface every accelerator is driven through. Features (precision, checkpoints,
// validation, ...) talk to hardware only through this class and c10's device-generic types.

#include <torchbridge/device_info.h>
#include <torchbridge/memory_stats.h>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace torchbridge {

// How far prepare_model goes. O0 places the model on the device and nothing else.
enum class OptLevel { O0, O1, O2, O3 };
std::string to_string(OptLevel level);
// Parses "O0".."O3" (case-insensitive); anything else raises naming the valid levels.
OptLevel parse_opt_level(const std::string& text);
// Raises NotImplementedError for levels not built yet (O1-O3), never silently running O0.
// Shared by the C++ and Python prepare_model.
void require_supported_opt_level(OptLevel level);

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

  // Places `module` on device `index` and applies the optimizations of `level`.
  // Only O0 exists so far; O1-O3 raise "not yet supported" rather than silently doing O0.
  void prepare_model(torch::nn::Module& module, OptLevel level = OptLevel::O0, int index = 0) const;

 protected:
  // Raises with the reason unless the backend is available.
  void check_available() const;
  // Raises unless the backend is available and 0 <= index < device_count().
  void check_device_index(int index) const;
};

}  // namespace torchbridge

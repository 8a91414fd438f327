// c10's device guard for an SDK device: every question is answered by the vendor runtime.
#include "sdk/guard_impl.h"

#include "sdk/caching_allocator.h"
#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

namespace torchbridge::sdk {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

class SdkGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    if (device.index() != previous.index()) setDevice(device);
    return previous;
  }

  c10::Device getDevice() const override {
    int32_t index = 0;
    TB_CALL(get_device, &index);
    return c10::Device(kType, static_cast<c10::DeviceIndex>(index));
  }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kType, "expected a ", runtime().name(), " device, got ", device);
    TB_CALL(set_device, device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (in_bad_fork()) return;
    runtime().table().set_device(runtime().context(), device.index());
  }

  // A device without an index (torch.Stream("emu")) means the current device.
  c10::DeviceIndex resolve(c10::DeviceIndex index) const { return index >= 0 ? index : getDevice().index(); }

  c10::Stream getStream(c10::Device device) const override { return current_stream(resolve(device.index())); }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return default_stream(resolve(device.index()));
  }
  // CUDA's answer to both: a stream from a pool. High priority is -1, as torch.cuda's pools have
  // it (lower runs first); the runtime receives the number and may clamp it to what it supports.
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority) const override {
    return pool_stream(resolve(device.index()), high_priority ? -1 : 0);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return pool_stream(resolve(device.index()), priority);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override { return exchange_current_stream(stream); }

  c10::DeviceIndex deviceCount() const noexcept override {
    if (in_bad_fork()) return 0;  // noexcept: the next real use raises the explanation
    int32_t count = 0;
    if (runtime().table().device_count(runtime().context(), &count) != TB_SUCCESS) return 0;
    return static_cast<c10::DeviceIndex>(count);
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "event of device ",
                int(device_index), " cannot be recorded on a stream of device ", int(stream.device_index()));
    if (*event == nullptr) {
      *event = runtime().create_event(stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT ? 1 : 0);
    }
    TB_CALL(event_record, static_cast<tb_event>(*event), native_stream(stream));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;  // never recorded: nothing to wait for (CUDA semantics)
    TB_CALL(stream_wait_event, native_stream(stream), static_cast<tb_event>(event));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    const tb_status status = runtime().table().event_query(runtime().context(), static_cast<tb_event>(event));
    if (status == TB_ERROR_NOT_READY) return false;
    runtime().check(status, "event_query");
    return true;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr && !in_bad_fork()) runtime().table().event_destroy(runtime().context(), static_cast<tb_event>(event));
  }

  bool queryStream(const c10::Stream& stream) const override {
    const tb_status status = runtime().table().stream_query(runtime().context(), native_stream(stream));
    if (status == TB_ERROR_NOT_READY) return false;
    runtime().check(status, "stream_query");
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    TB_CALL(stream_synchronize, native_stream(stream));
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) TB_CALL(event_synchronize, static_cast<tb_event>(event));
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    TB_CALL(device_synchronize, resolve(device_index));
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    caching_allocator().recordStream(data_ptr, stream);
  }

  // The dtypes an SDK device computes in: those torch's CPU kernels (the fallback) compute in.
  // Quantized, bit-packed and fp8 types are storage formats there, not arithmetic, so they are
  // not claimed.
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    c10::DeviceCapability capability;
    capability.capability_data.capability_bits = 0;
    auto& has = capability.capability_data.supported_scalar_types;
    has.has_Bool = has.has_Byte = has.has_Char = has.has_Short = has.has_Int = has.has_Long = 1;
    has.has_Half = has.has_BFloat16 = has.has_Float = has.has_Double = 1;
    has.has_ComplexFloat = has.has_ComplexDouble = 1;
    return capability;
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "both events must be recorded before asking for the elapsed time");
    float milliseconds = 0;
    TB_CALL(event_elapsed_time, static_cast<tb_event>(start), static_cast<tb_event>(end), &milliseconds);
    return milliseconds;
  }
};

}  // namespace

const c10::impl::DeviceGuardImplInterface* make_guard_impl() { return new SdkGuardImpl(); }

}  // namespace torchbridge::sdk

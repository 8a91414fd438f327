// EmuRuntime: construction, the device entries and the device-index check the others share.
#include "emu_runtime.h"

#include "last_error.h"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#ifndef TORCHBRIDGE_EMU_VERSION
#error "TORCHBRIDGE_EMU_VERSION must be defined by the build (the project version)"
#endif

namespace torchbridge::emu {
namespace {

// "Current device" is per host thread (runtime.h); a new thread starts on device 0.
thread_local int32_t t_current_device = 0;

template <std::size_t N>
void copy_text(char (&field)[N], const char* text) {
  std::snprintf(field, N, "%s", text);
}

}  // namespace

std::unique_ptr<EmuRuntime> EmuRuntime::create(const EmuOptions& options, std::string& error) {
  std::unique_ptr<EmuRuntime> runtime(new EmuRuntime(options));
  for (int index = 0; index < options.device_count; ++index) {
    auto device = EmuDevice::create(index, options.memory_capacity_bytes, options.guarded, error);
    if (!device) return nullptr;
    runtime->devices_.push_back(std::move(device));
  }
  return runtime;
}

tb_status EmuRuntime::check_device(const char* operation, int32_t device) const {
  if (device >= 0 && device < static_cast<int32_t>(devices_.size())) return TB_SUCCESS;
  return fail(TB_ERROR_INVALID_DEVICE, std::string(operation) + ": device " + std::to_string(device) +
                                           " does not exist; this emu runtime has " +
                                           std::to_string(devices_.size()) + " devices (0.." +
                                           std::to_string(devices_.size() - 1) + ")");
}

tb_status EmuRuntime::device_count(int32_t* count) const {
  if (count == nullptr) return fail(TB_ERROR_INVALID_VALUE, "device_count: count is NULL");
  *count = static_cast<int32_t>(devices_.size());
  return TB_SUCCESS;
}

tb_status EmuRuntime::set_device(int32_t device) {
  if (const tb_status status = check_device("set_device", device); status != TB_SUCCESS) return status;
  t_current_device = device;
  return TB_SUCCESS;
}

tb_status EmuRuntime::get_device(int32_t* device) const {
  if (device == nullptr) return fail(TB_ERROR_INVALID_VALUE, "get_device: device is NULL");
  *device = t_current_device;
  return TB_SUCCESS;
}

tb_status EmuRuntime::device_properties(int32_t device, tb_device_properties* properties) const {
  if (const tb_status status = check_device("device_properties", device); status != TB_SUCCESS) return status;
  if (properties == nullptr) return fail(TB_ERROR_INVALID_VALUE, "device_properties: properties is NULL");
  const EmuDevice& emu_device = *devices_[static_cast<std::size_t>(device)];
  *properties = tb_device_properties{};
  copy_text(properties->name, "TorchBridge emulated accelerator");
  copy_text(properties->vendor, "TorchBridge");
  copy_text(properties->architecture, options_.guarded ? "emu-guarded" : "emu");
  copy_text(properties->driver_version, TORCHBRIDGE_EMU_VERSION);
  properties->total_memory_bytes = emu_device.memory().capacity();
  properties->free_memory_bytes = emu_device.free_bytes();
  properties->multiprocessor_count = 0;  // nothing meaningful to count: work runs on one thread per stream
  properties->host_addressable = emu_device.memory().host_addressable() ? 1 : 0;
  properties->is_real_hardware = 0;
  return TB_SUCCESS;
}

tb_status EmuRuntime::device_synchronize(int32_t device) {
  if (const tb_status status = check_device("device_synchronize", device); status != TB_SUCCESS) return status;
  for (const auto& stream : streams_.snapshot()) {
    if (stream->device() == device) stream->synchronize();
  }
  return TB_SUCCESS;
}

}  // namespace torchbridge::emu

#pragma once
// Turning a vendor runtime (include/torchbridge/sdk/runtime.h) into a PyTorch device.

#include <torchbridge/sdk/runtime.h>

#include <c10/core/Stream.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::sdk {

// Environment variable: "1" makes every operator without a native kernel raise instead of
// running on the CPU fallback.
inline constexpr const char* kStrictEnvVar = "TORCHBRIDGE_SDK_STRICT";
// Environment variable: extra directories (':'-separated) searched for device libraries before
// the directory holding libtorchbridge.
inline constexpr const char* kDevicePathEnvVar = "TORCHBRIDGE_DEVICE_PATH";

// Registers `runtime` as PyTorch's PrivateUse1 device under runtime->name: backend rename,
// device guard, hooks, caching allocator, pinned host allocator, generators, streams, events,
// native operators, the CPU fallback and autocast. PyTorch has one PrivateUse1 slot: registering
// a second, different runtime (or when another plugin holds the slot) raises. Registering the
// same table again is a no-op.
void register_runtime(const tb_runtime* runtime);

// Loads libtorchbridge_device_NAME.so (from TORCHBRIDGE_DEVICE_PATH, then next to
// libtorchbridge) and registers the runtime it exports. A no-op when NAME is already registered.
void load_device(const std::string& name);

// Names of the device libraries found on the search path (e.g. {"emu"}).
std::vector<std::string> available_devices();
// Name of the SDK device registered in this process, if any.
std::optional<std::string> registered_device();
// Why a backward pass on the registered device would fail inside PyTorch, when it would: the
// device was registered after the process's first backward pass, and PyTorch's autograd engine
// sized its per-device queues then (registering warns with the same sentence). nullopt otherwise.
std::optional<std::string> autograd_refusal();
// True in a process forked after the device was registered: the device cannot be used there.
bool in_bad_fork();

// The priority TorchBridge asked the runtime for when it created `stream` (a stream of the
// registered device; 0 for the default stream). CUDA's convention: lower runs first, 0 to -3.
// c10::ValueError for a stream of another device type or an id the device never handed out.
int stream_priority(const c10::Stream& stream);

// Caps the caching allocator of the registered device's device `index` at `fraction` (0 to 1) of
// its total memory, as torch.cuda.set_per_process_memory_fraction caps CUDA's: a segment that would
// take the bytes reserved on that device past the cap is refused like one the device has no room
// for (the cache is freed, then OutOfMemoryError, naming the cap). Reserved bytes above a new, lower
// cap stay; each later segment is refused until enough is freed to fit under it. Default 1.
// c10::ValueError for a fraction outside [0, 1], c10::IndexError for a device the runtime does not have.
void set_memory_fraction(double fraction, int index);
double memory_fraction(int index);

// How often each operator ("aten::add.Tensor") ran on the CPU fallback since the last reset.
std::map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();

}  // namespace torchbridge::sdk

#pragma once
// Where and in which dtype each restored tensor goes: the device map (longest module-path prefix,
// or "auto" by free memory) and the dtype policy (keep, cast, or convert only what the device
// cannot hold, fp8 widened with its stored scale). auto_device_map (declared in the public
// training_state.h, which Python's "auto" device map calls too) lives here as well.

#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/checkpoint/training_state.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

namespace torchbridge::checkpoint {

// The device of the longest prefix of `name` in options.device_map; `current` when none matches.
// Whether a device-map prefix places the tensor `name`: "" places all, "enc" enc.weight and enc.x.y,
// never encoder.weight.
bool prefix_matches(const std::string& prefix, const std::string& name);
c10::Device device_for(const std::string& name, const RestoreOptions& options, const c10::Device& current);

// The dtype the policy gives a saved tensor bound for `device`.
c10::ScalarType dtype_for(const at::Tensor& saved, const RestoreOptions& options, const c10::Device& device);

// The saved tensor `key` in `dtype`: an fp8 tensor widened to another dtype is multiplied by its
// stored dequantization factor, `<key>` + one of kFp8ScaleSuffixes (checkpoint.h),
// per tensor, per row or per block of a 2-D weight. `applied_factor`, when given, receives that
// factor's key ("" when none was applied).
at::Tensor widen(const SafetensorsFile& file, const std::string& key, const at::Tensor& saved, c10::ScalarType dtype,
                 std::string* applied_factor = nullptr);

}  // namespace torchbridge::checkpoint

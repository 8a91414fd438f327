#include "checkpoint/placement_policy.h"

#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/registry.h>

#include <ATen/ops/mul.h>
#include <ATen/ops/repeat_interleave.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <optional>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

// Every float8 dtype torch has (e4m3fn, e5m2, their fnuz variants, e8m0 scales).
bool is_fp8(c10::ScalarType dtype) { return c10::isFloat8Type(dtype); }

bool device_holds(const c10::Device& device, c10::ScalarType dtype) {
  const auto backend = BackendRegistry::instance().lookup(c10::DeviceTypeName(device.type(), true));
  const auto& dtypes = backend->info(device.has_index() ? device.index() : 0).supported_dtypes;
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

}  // namespace

bool prefix_matches(const std::string& prefix, const std::string& name) {
  // A module path, as in Python: "enc" places enc.weight and a tensor named enc itself, not
  // encoder.weight ("" places all). A trailing '.' (auto_device_map's "0.") names the same path:
  // the map gives a tensor at the model's root, such as "scale", the prefix "scale.".
  const std::string_view module =
      !prefix.empty() && prefix.back() == '.' ? std::string_view(prefix).substr(0, prefix.size() - 1) : prefix;
  if (module.empty()) return true;
  return name.rfind(module, 0) == 0 && (name.size() == module.size() || name[module.size()] == '.');
}

c10::Device device_for(const std::string& name, const RestoreOptions& options, const c10::Device& current) {
  std::optional<std::pair<size_t, c10::Device>> best;
  for (const auto& [prefix, device] : options.device_map) {
    if (prefix_matches(prefix, name) && (!best || prefix.size() > best->first)) best = {prefix.size(), device};
  }
  return best ? best->second : current;
}

c10::ScalarType dtype_for(const at::Tensor& saved, const RestoreOptions& options, const c10::Device& device) {
  if (!saved.is_floating_point()) return saved.scalar_type();
  switch (options.dtype_policy) {
    case DtypePolicy::kKeep: return saved.scalar_type();
    case DtypePolicy::kCastFloating: return options.cast_to;
    case DtypePolicy::kConvertUnsupported: {
      const auto dtype = saved.scalar_type();
      if (dtype != at::kBFloat16 && dtype != at::kHalf && !is_fp8(dtype)) return dtype;
      if (device_holds(device, dtype)) return dtype;
      // fp8 widens to bf16 where the device has it; everything else to fp32.
      return is_fp8(dtype) && device_holds(device, at::kBFloat16) ? at::kBFloat16 : at::kFloat;
    }
  }
  return saved.scalar_type();
}

at::Tensor dequantize(const at::Tensor& value, const at::Tensor& factor, const std::string& key,
                      const std::string& factor_key) {
  // Per tensor or per row/column: a factor that broadcasts to the weight without widening it.
  bool broadcasts = factor.dim() <= value.dim();
  for (int64_t d = 1; broadcasts && d <= factor.dim(); ++d) {
    broadcasts = factor.size(-d) == 1 || factor.size(-d) == value.size(-d);
  }
  if (broadcasts) return at::mul(value, factor);
  // Block-wise factors (DeepSeek-V3, transformers' fine-grained FP8): one per block of a 2-D
  // weight. The file does not say the block size; like transformers, take it as the weight's size
  // over the factor grid's, which must divide evenly.
  TORCH_CHECK_VALUE(value.dim() == 2 && factor.dim() == 2 && factor.size(0) > 0 && factor.size(1) > 0 &&
                        value.size(0) % factor.size(0) == 0 && value.size(1) % factor.size(1) == 0,
                    "checkpoint: cannot dequantize '", key, "' of shape ", value.sizes(), " with '", factor_key,
                    "' of shape ", factor.sizes(), ": expected a factor that broadcasts to the weight or a 2-D "
                    "grid of blocks that divides it evenly");
  return at::mul(value, factor.repeat_interleave(value.size(0) / factor.size(0), 0)
                            .repeat_interleave(value.size(1) / factor.size(1), 1));
}

at::Tensor widen(const SafetensorsFile& file, const std::string& key, const at::Tensor& saved, c10::ScalarType dtype,
                 std::string* applied_factor) {
  if (applied_factor != nullptr) applied_factor->clear();
  if (!is_fp8(saved.scalar_type()) || is_fp8(dtype)) return saved.to(dtype);
  const at::Tensor value = saved.to(at::kFloat);
  for (const std::string_view suffix : kFp8ScaleSuffixes) {
    const std::string factor_key = key + std::string(suffix);
    if (file.contains(factor_key)) {
      if (applied_factor != nullptr) *applied_factor = factor_key;
      return dequantize(value, file.load(factor_key).to(at::kFloat), key, factor_key).to(dtype);
    }
  }
  return value.to(dtype);
}

std::vector<std::pair<std::string, c10::Device>> auto_device_map(
    const std::vector<std::pair<std::string, int64_t>>& tensor_bytes, const std::string& backend_name) {
  const auto backend = create_backend(backend_name);
  std::vector<std::pair<c10::Device, double>> devices;  // device, free bytes
  double free_total = 0;
  for (int i = 0; i < backend->device_count(); ++i) {
    const auto free = backend->memory_stats(i).free_bytes;
    TORCH_CHECK(free.has_value(), "the auto device map needs free memory, which backend '", backend->name(),
                "' does not report");
    devices.emplace_back(backend->device(i), double(*free));
    free_total += double(*free);
  }
  // Bytes per top-level module, in model order.
  std::vector<std::pair<std::string, int64_t>> modules;
  int64_t total = 0;
  for (const auto& [name, bytes] : tensor_bytes) {
    const std::string top = name.substr(0, name.find('.')) + ".";
    if (modules.empty() || modules.back().first != top) modules.emplace_back(top, 0);
    modules.back().second += bytes;
    total += bytes;
  }
  std::vector<std::pair<std::string, c10::Device>> map;
  size_t device = 0;
  double budget = total * devices[0].second / free_total, used = 0;
  for (const auto& [prefix, bytes] : modules) {
    // Move on once this device's share is taken (the last device takes whatever remains).
    if (used > 0 && used + bytes > budget + 1e-9 && device + 1 < devices.size()) {
      ++device;
      budget = total * devices[device].second / free_total;
      used = 0;
    }
    map.emplace_back(prefix, devices[device].first);
    used += bytes;
  }
  return map;
}

}  // namespace torchbridge::checkpoint

#include <torchbridge/json_text.h>

#include <torchbridge/backend.h>

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

template <typename T>
nlohmann::json optional_value(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json text_or_null(const std::string& text) {
  return text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text);
}

nlohmann::json to_json(const DeviceInfo& info) {
  nlohmann::json dtypes = nlohmann::json::array();
  for (const auto dtype : info.supported_dtypes) dtypes.push_back(dtype_name(dtype));
  nlohmann::json out = {
      {"name", text_or_null(info.name)},
      {"vendor", text_or_null(info.vendor)},
      {"backend", info.backend},
      {"index", info.index},
      {"total_memory_bytes", optional_value(info.total_memory_bytes)},
      {"free_memory_bytes", optional_value(info.free_memory_bytes)},
      {"architecture", text_or_null(info.architecture)},
      {"multiprocessor_count", optional_value(info.multiprocessor_count)},
      {"driver_version", text_or_null(info.driver_version)},
      {"runtime_version", text_or_null(info.runtime_version)},
      {"supported_dtypes", dtypes},
      {"features",
       {{"tf32", info.features.tf32},
        {"bf16", info.features.bf16},
        {"fp16", info.features.fp16},
        {"fp8", info.features.fp8},
        {"flash_attention", info.features.flash_attention},
        {"unified_memory", info.features.unified_memory}}},
      {"cpu", nullptr},
  };
  if (info.cpu) {
    const auto& isa = info.cpu->isa;
    out["cpu"] = {{"model_name", info.cpu->model_name},
                  {"physical_cores", info.cpu->physical_cores},
                  {"logical_cores", info.cpu->logical_cores},
                  {"ram_bytes", info.cpu->ram_bytes},
                  {"isa",
                   {{"avx2", isa.avx2},
                    {"avx512f", isa.avx512f},
                    {"avx512_bf16", isa.avx512_bf16},
                    {"amx_bf16", isa.amx_bf16},
                    {"avx512_fp16", isa.avx512_fp16},
                    {"amx_fp16", isa.amx_fp16},
                    {"arm_bf16", isa.arm_bf16},
                    {"arm_fp16", isa.arm_fp16}}}};
  }
  return out;
}

nlohmann::json to_json(const MemoryStats& stats) {
  return {
      {"allocated_bytes", optional_value(stats.allocated_bytes)},
      {"reserved_bytes", optional_value(stats.reserved_bytes)},
      {"active_bytes", optional_value(stats.active_bytes)},
      {"peak_allocated_bytes", optional_value(stats.peak_allocated_bytes)},
      {"peak_reserved_bytes", optional_value(stats.peak_reserved_bytes)},
      {"free_bytes", optional_value(stats.free_bytes)},
      {"total_bytes", optional_value(stats.total_bytes)},
      {"allocation_count", optional_value(stats.allocation_count)},
      {"out_of_memory_count", optional_value(stats.out_of_memory_count)},
      {"source", stats.source},
  };
}

nlohmann::json to_json(const PrecisionDecision& decision, const std::vector<PrecisionCapability>& capabilities) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : capabilities) {
    rows.push_back({{"precision", name_of(c.precision)}, {"support", to_string(c.support)}, {"reason", c.reason}});
  }
  return {{"requested", decision.requested},
          {"precision", name_of(decision.precision)},
          {"support", to_string(decision.support)},
          {"device", decision.device},
          {"reason", decision.reason},
          {"capabilities", rows}};
}

}  // namespace

std::string to_json_text(const PrecisionDecision& decision, const std::vector<PrecisionCapability>& capabilities,
                         int indent) {
  return to_json(decision, capabilities).dump(indent);
}

std::string to_json_text(const DeviceInfo& info, int indent) { return to_json(info).dump(indent); }

std::string to_json_text(const MemoryStats& stats, int indent) { return to_json(stats).dump(indent); }

}  // namespace torchbridge

// `torchbridge info`: every backend, available or not and why, and every device's description
// and memory statistics.
#include "arguments.h"
#include "commands.h"
#include "printable_json.h"
#include "text_format.h"

#include <torchbridge/error_summary.h>
#include <torchbridge/json_text.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/optimize/hardware_config.h>
#include <torchbridge/precision.h>
#include <torchbridge/precision_policy.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>
#include <torchbridge/version.h>

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge info [--json] [--backend NAME] [--config FILE]

Lists every backend TorchBridge knows, whether it is available here and why not, and for each
device its description (DeviceInfo), memory statistics (MemoryStats), how it runs each precision
(native, emulated in software, unavailable) and the precision "auto" chooses there, with the reason.

  --backend NAME   only this backend (a name or alias, e.g. cuda, nvidia, rocm, cpu), or an SDK
                   device installed here (e.g. emu), which it loads: one that fails to start is
                   listed with status driver_error and the runtime's message
  --config FILE    a TorchBridgeConfig file (.json/.toml): what its hardware.* settings do on each
                   device. Without it, TORCHBRIDGE_HARDWARE_* variables are shown the same way.
  --json           machine-readable output (schema: docs/cli-json.md)
)";

struct DeviceReport {
  std::optional<DeviceInfo> info;
  std::optional<MemoryStats> memory;
  std::optional<PrecisionDecision> precision;  // what "auto" chooses here, and why
  std::vector<HardwareNote> hardware;          // the configuration's hardware.* settings set here
  std::string hardware_error;                  // a setting this device refuses
  std::string error;
};

DeviceReport describe_device(Backend& backend, int index, const HardwareConfig& hardware) {
  DeviceReport report;
  try {
    report.info = backend.info(index);
    report.memory = backend.memory_stats(index);
    report.precision = decide_precision(*report.info, "auto");
  } catch (const std::exception& e) {
    report.error = error_summary(e.what());
    return report;
  }
  try {
    report.hardware = hardware_notes(hardware, *report.info);
  } catch (const std::exception& e) {
    report.hardware_error = error_summary(e.what());
  }
  return report;
}

nlohmann::json hardware_json(const DeviceReport& report) {
  if (!report.hardware_error.empty()) return {{"refused", report.hardware_error}};
  nlohmann::json notes = nlohmann::json::array();
  for (const auto& note : report.hardware) {
    notes.push_back({{"field", note.field}, {"applies", note.applies}, {"detail", note.detail}});
  }
  return notes;
}

nlohmann::json backend_json(const BackendEntry& entry, const HardwareConfig& hardware) {
  Backend& backend = *entry.backend;
  const Availability availability = backend.availability();
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < backend.device_count(); ++i) {
    const DeviceReport report = describe_device(backend, i, hardware);
    devices.push_back({{"index", i},
                       {"hardware_settings", hardware_json(report)},
                       {"info", report.info ? nlohmann::json::parse(to_json_text(*report.info)) : nlohmann::json(nullptr)},
                       {"memory", report.memory ? nlohmann::json::parse(to_json_text(*report.memory)) : nlohmann::json(nullptr)},
                       {"precision", report.precision ? nlohmann::json::parse(to_json_text(
                                                            *report.precision, precision_capabilities(*report.info)))
                                                      : nlohmann::json(nullptr)},
                       {"error", report.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(report.error)}});
  }
  return {{"name", entry.name},
          {"aliases", entry.aliases},
          {"device_type", c10::DeviceTypeName(backend.device_type(), true)},
          {"available", availability.available()},
          {"status", to_string(availability.status)},
          {"reason", availability.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(availability.reason)},
          {"is_real_hardware", backend.is_real_hardware()},
          {"device_count", backend.device_count()},
          {"devices", devices}};
}

// An SDK device whose library failed to start is a backend that is not available, and why: info
// reports it as it reports a CUDA driver error, rather than failing.
struct FailedSdkDevice {
  std::string name;
  std::string reason;
};

nlohmann::json failed_sdk_device_json(const FailedSdkDevice& failed) {
  return {{"name", failed.name},
          {"aliases", nlohmann::json::array()},
          {"device_type", c10::DeviceTypeName(c10::DeviceType::PrivateUse1, true)},
          {"available", false},
          {"status", to_string(AvailabilityStatus::kDriverError)},
          {"reason", failed.reason},
          {"is_real_hardware", nullptr},  // the library says so once started; it did not start
          {"device_count", 0},
          {"devices", nlohmann::json::array()}};
}

void print_device(const std::string& backend_name, int index, const DeviceReport& report) {
  std::cout << "\n" << backend_name << ":" << index;
  if (!report.error.empty()) {
    std::cout << "  error: " << report.error << "\n";
    return;
  }
  const DeviceInfo& info = *report.info;
  std::cout << "  " << (info.name.empty() ? "(name not reported)" : info.name);
  if (!info.vendor.empty()) std::cout << " [" << info.vendor << "]";
  std::cout << "\n";
  std::cout << "  architecture   " << (info.architecture.empty() ? "-" : info.architecture);
  if (info.multiprocessor_count) std::cout << ", " << *info.multiprocessor_count << " multiprocessors/cores";
  std::cout << "\n";
  if (info.cpu) {
    const auto& isa = info.cpu->isa;
    std::cout << "  cores          " << info.cpu->physical_cores << " physical, " << info.cpu->logical_cores
              << " logical\n"
              << "  ISA            avx2 " << yes_no(isa.avx2) << ", avx512f " << yes_no(isa.avx512f)
              << ", avx512_bf16 " << yes_no(isa.avx512_bf16) << ", amx_bf16 " << yes_no(isa.amx_bf16)
              << ", avx512_fp16 " << yes_no(isa.avx512_fp16) << ", arm bf16 " << yes_no(isa.arm_bf16) << "\n";
  }
  std::cout << "  memory         total " << format_bytes(info.total_memory_bytes) << ", free "
            << format_bytes(info.free_memory_bytes) << "\n";
  std::cout << "  driver/runtime " << (info.driver_version.empty() ? "-" : info.driver_version) << " / "
            << (info.runtime_version.empty() ? "-" : info.runtime_version) << "\n";
  std::cout << "  dtypes         ";
  for (size_t i = 0; i < info.supported_dtypes.size(); ++i) {
    std::cout << (i ? ", " : "") << dtype_name(info.supported_dtypes[i]);
  }
  const auto& f = info.features;
  std::cout << "\n  features       tf32 " << yes_no(f.tf32) << ", bf16 " << yes_no(f.bf16) << ", fp16 "
            << yes_no(f.fp16) << ", fp8 " << yes_no(f.fp8) << ", flash attention " << yes_no(f.flash_attention)
            << ", unified memory " << yes_no(f.unified_memory) << "\n";
  std::cout << "  precisions     ";
  const auto capabilities = precision_capabilities(info);
  for (size_t i = 0; i < capabilities.size(); ++i) {
    std::cout << (i ? ", " : "") << name_of(capabilities[i].precision) << " " << to_string(capabilities[i].support);
  }
  std::cout << "\n  auto precision " << name_of(report.precision->precision) << " (" << report.precision->reason << ")\n";
  const MemoryStats& m = *report.memory;
  std::cout << "  memory stats   allocated " << format_bytes(m.allocated_bytes) << " (peak "
            << format_bytes(m.peak_allocated_bytes) << "), reserved " << format_bytes(m.reserved_bytes)
            << " (peak " << format_bytes(m.peak_reserved_bytes) << "), active " << format_bytes(m.active_bytes)
            << "\n                 allocations "
            << (m.allocation_count ? std::to_string(*m.allocation_count) : "-") << ", OOMs "
            << (m.out_of_memory_count ? std::to_string(*m.out_of_memory_count) : "-") << "\n"
            << "  stats source   " << m.source << "\n";
  if (!report.hardware_error.empty()) std::cout << "  hardware cfg   refused: " << report.hardware_error << "\n";
  for (const auto& note : report.hardware) {
    std::cout << "  hardware cfg   " << note.field << (note.applies ? " applies: " : " does not apply: ") << note.detail
              << "\n";
  }
}

}  // namespace

int run_info(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("info", args, {{"--json"}, {"--backend", "--config"}});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  const BackendRegistry& registry = BackendRegistry::instance();
  std::vector<BackendEntry> selected;
  // Listing every backend loads no SDK device (each would take the process's single PrivateUse1
  // slot): those installed are named, so that a reader knows what --backend can load.
  const std::vector<std::string> installed_sdk_devices = sdk::available_devices();
  std::optional<FailedSdkDevice> failed_sdk_device;
  const std::string* wanted = parsed.option("--backend");
  if (wanted != nullptr) {
    std::shared_ptr<Backend> backend;
    try {
      backend = registry.lookup(*wanted);  // raises for unknown names, and loads SDK devices
    } catch (const c10::Error& e) {
      if (std::find(installed_sdk_devices.begin(), installed_sdk_devices.end(), *wanted) ==
          installed_sdk_devices.end()) {
        throw;  // not an installed SDK device: an unknown name, refused as such
      }
      failed_sdk_device = FailedSdkDevice{*wanted, error_summary(e.what())};
    }
    for (const auto& entry : registry.entries()) {
      if (backend && entry.backend == backend) selected.push_back(entry);
    }
  } else {
    selected = registry.entries();
  }

  const std::string* config_file = parsed.option("--config");
  // Only the TORCHBRIDGE_HARDWARE_* variables: the others (TORCHBRIDGE_BACKEND, ...) are what
  // info reports on, not settings to check.
  const auto hardware_variables = [](const char* name) -> const char* {
    return std::string_view(name).starts_with("TORCHBRIDGE_HARDWARE_") ? std::getenv(name) : nullptr;
  };
  const HardwareConfig hardware =
      (config_file ? load_config(*config_file) : with_environment(TorchBridgeConfig{}, hardware_variables)).hardware;

  std::optional<std::string> best;
  std::string best_error;
  try {
    best = registry.detect_best_backend();
  } catch (const std::exception& e) {
    best_error = error_summary(e.what());
  }

  if (parsed.has("--json")) {
    nlohmann::json backends = nlohmann::json::array();
    for (const auto& entry : selected) backends.push_back(backend_json(entry, hardware));
    if (failed_sdk_device) backends.push_back(failed_sdk_device_json(*failed_sdk_device));
    const nlohmann::json out = {
        {"schema_version", 1},
        {"torchbridge_version", library_version()},
        {"torch_version", TORCH_VERSION},
        {"best_backend", best ? nlohmann::json(*best) : nlohmann::json(nullptr)},
        {"best_backend_error", best_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(best_error)},
        {"backends", backends},
        {"installed_sdk_devices", installed_sdk_devices}};
    std::cout << printable_json(out, 2) << "\n";
    return 0;
  }

  std::cout << "TorchBridge " << library_version() << " on torch " << TORCH_VERSION << "\n";
  std::cout << "best backend: " << (best ? *best : "none (" + best_error + ")") << "\n\n";
  std::cout << column("BACKEND", 15) << column("STATUS", 16) << column("DEVICES", 9) << "REASON\n";
  for (const auto& entry : selected) {
    const Availability a = entry.backend->availability();
    std::cout << column(entry.name, 15) << column(to_string(a.status), 16)
              << column(std::to_string(entry.backend->device_count()), 9) << a.reason << "\n";
  }
  if (failed_sdk_device) {
    std::cout << column(failed_sdk_device->name, 15) << column(to_string(AvailabilityStatus::kDriverError), 16)
              << column("0", 9) << failed_sdk_device->reason << "\n";
  }
  if (!installed_sdk_devices.empty() && !sdk::registered_device()) {
    std::cout << "\nSDK devices installed here: " << comma_separated(installed_sdk_devices)
              << " (none is loaded; `torchbridge info --backend NAME` loads one)\n";
  }
  for (const auto& entry : selected) {
    for (int i = 0; i < entry.backend->device_count(); ++i) {
      print_device(entry.name, i, describe_device(*entry.backend, i, hardware));
    }
  }
  return 0;
}

}  // namespace torchbridge::cli

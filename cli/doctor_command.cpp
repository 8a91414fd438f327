// `torchbridge doctor`: is this installation healthy? Torch build configuration, the library's
// own load, a real round-trip check of every device, and the environment overrides in effect.
// Exit code: 0 healthy, 1 at least one failure, 2 warnings only.
#include "arguments.h"
#include "commands.h"
#include "compiler_runtime.h"
#include "printable_json.h"
#include "text_format.h"

#include <torchbridge/closest_name.h>
#include <torchbridge/error_summary.h>
#include <torchbridge/health.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/registry.h>
#include <torchbridge/sdk/device.h>
#include <torchbridge/version.h>

#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/MPSHooksInterface.h>
#include <ATen/detail/XPUHooksInterface.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>  // environ

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge doctor [--json] [--backend NAME]

Checks this installation: torch's build configuration, that libtorchbridge and libtorch load
and match, a real health check of every available device (allocate, copy a known pattern there
and back, compare, synchronize; timed), the SDK device libraries it can find, and the environment
variables that change behaviour; a TORCHBRIDGE_ variable a letter or two away from one TorchBridge
reads is a warning naming that one (a typo's setting is ignored).

Exit code: 0 healthy, 1 at least one check failed, 2 warnings only.
  --json           machine-readable output (schema: docs/cli-json.md)
  --backend NAME   health-check this backend's devices only; an SDK device (e.g. emu, or a
                   vendor's library on TORCHBRIDGE_DEVICE_PATH) is loaded by its name
)";

enum class Outcome { kOk, kWarning, kFailure };
const char* outcome_name(Outcome o) {
  return o == Outcome::kOk ? "ok" : o == Outcome::kWarning ? "warning" : "failure";
}

struct Check {
  std::string name;
  Outcome outcome;
  std::string detail;
  std::optional<double> duration_ms;
};

std::string shared_object_of(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) != 0 && info.dli_fname != nullptr) return info.dli_fname;
  return "";
}

// Variables that change which devices exist or how TorchBridge and torch behave: these, and every
// TORCHBRIDGE_* variable (the device search path, configuration overrides, emu's options, ...).
const char* const kEnvironmentOverrides[] = {
    "TORCHBRIDGE_BACKEND",     "TORCHBRIDGE_LOG_LEVEL",  "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",     "ROCR_VISIBLE_DEVICES",   "ZE_AFFINITY_MASK",     "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ENABLE_MPS_FALLBACK", "OMP_NUM_THREADS",    "MKL_NUM_THREADS",      "CXX"};

std::vector<Check> library_checks() {
  std::vector<Check> checks;
  const std::string library = shared_object_of(reinterpret_cast<const void*>(&library_version));
  const std::string torch_library = shared_object_of(reinterpret_cast<const void*>(&at::show_config));
  const bool versions_match = std::string(library_version()) == TORCHBRIDGE_VERSION_STRING;
  checks.push_back({"libtorchbridge load", versions_match ? Outcome::kOk : Outcome::kFailure,
                    (library.empty() ? std::string("(path unknown)") : library) + " version " +
                        library_version() +
                        (versions_match ? "" : std::string(" does not match this tool's ") +
                                                   TORCHBRIDGE_VERSION_STRING),
                    std::nullopt});
  checks.push_back({"libtorch load", torch_library.empty() ? Outcome::kFailure : Outcome::kOk,
                    torch_library.empty() ? "libtorch symbols not found" : torch_library, std::nullopt});
  return checks;
}

// The device libraries the SDK can load by name, without loading any (each would take the
// process's single PrivateUse1 slot).
Check sdk_device_check() {
  const std::vector<std::string> names = sdk::available_devices();
  const std::string detail = names.empty()
                                 ? "none found (searched TORCHBRIDGE_DEVICE_PATH and next to libtorchbridge)"
                                 : comma_separated(names) + " (check one with --backend NAME)";
  return {"SDK device libraries", Outcome::kOk, detail, std::nullopt};
}

// wanted: only this backend (loaded by name when it is an SDK device), else every registered one.
std::vector<Check> backend_checks(const std::string* wanted) {
  std::vector<Check> checks;
  const BackendRegistry& registry = BackendRegistry::instance();
  std::shared_ptr<Backend> only;
  if (wanted != nullptr) {
    try {
      only = registry.lookup(*wanted);
    } catch (const std::exception& e) {
      checks.push_back({*wanted + " load", Outcome::kFailure, error_summary(e.what()), std::nullopt});
      return checks;
    }
  }
  try {
    checks.push_back({"best backend", Outcome::kOk, registry.detect_best_backend(), std::nullopt});
  } catch (const std::exception& e) {
    checks.push_back({"best backend", Outcome::kFailure, error_summary(e.what()), std::nullopt});
  }
  for (const auto& entry : registry.entries()) {
    if (only != nullptr && entry.backend != only) continue;
    const Availability a = entry.backend->availability();
    if (only != nullptr && !a.available()) {
      checks.push_back({entry.name + " availability", Outcome::kFailure, a.reason, std::nullopt});
      continue;
    }
    if (a.status == AvailabilityStatus::kDriverError) {
      // Compiled in but broken: the user likely expects this accelerator to work.
      checks.push_back({entry.name + " driver", Outcome::kWarning, a.reason, std::nullopt});
    }
    for (int i = 0; i < entry.backend->device_count(); ++i) {
      const HealthCheckResult r = run_health_check(*entry.backend, i);
      checks.push_back({entry.name + ":" + std::to_string(i) + " health",
                        r.passed ? Outcome::kOk : Outcome::kFailure, r.detail, r.duration_ms});
    }
  }
  return checks;
}

constexpr std::string_view kPrefix = "TORCHBRIDGE_";

// What follows TORCHBRIDGE_ in each variable TorchBridge reads at run time: the configuration's
// fields, and these outside it.
std::vector<std::string> runtime_variable_suffixes() {
  std::vector<std::string> suffixes = {
      "LOG_LEVEL",    // redirection's logging (Python)
      "LOAD_DEVICE",  // the SDK device `import torchbridge` loads (Python)
      "DEVICE_PATH",  // where the SDK looks for device libraries
      "SDK_STRICT",   // the SDK's CPU fallback refuses instead of warning
  };
  for (const auto& field : config_schema()) suffixes.emplace_back(std::string_view(field.environment).substr(kPrefix.size()));
  return suffixes;
}

// A TORCHBRIDGE_ variable a letter or two away from one TorchBridge reads, and not that one, is a
// typo whose setting nothing sees. Names far from every one are left alone: the build and test
// scripts and device libraries (TORCHBRIDGE_EMU_*) read variables of their own.
// `known`: runtime_variable_suffixes().
std::optional<Check> misspelled_variable_check(std::string_view name, const std::vector<std::string>& known) {
  const std::string suffix(name.substr(kPrefix.size()));
  if (std::find(known.begin(), known.end(), suffix) != known.end()) return std::nullopt;
  const std::string closest = closest_name(suffix, known);
  if (closest.empty()) return std::nullopt;
  return Check{std::string(name), Outcome::kWarning,
               "TorchBridge reads no such variable, so its setting is ignored; did you mean " +
                   std::string(kPrefix) + closest + "?",
               std::nullopt};
}

std::vector<Check> environment_checks(nlohmann::json& overrides) {
  std::vector<Check> checks;
  overrides = nlohmann::json::object();
  for (const char* name : kEnvironmentOverrides) {
    if (const char* value = std::getenv(name)) overrides[name] = value;
  }
  const std::vector<std::string> known = runtime_variable_suffixes();
  for (char** variable = environ; *variable != nullptr; ++variable) {
    const std::string_view entry(*variable);
    const size_t equals = entry.find('=');
    if (entry.starts_with(kPrefix) && equals != std::string_view::npos) {
      const std::string_view name = entry.substr(0, equals);
      overrides[std::string(name)] = std::string(entry.substr(equals + 1));
      if (auto typo = misspelled_variable_check(name, known)) checks.push_back(std::move(*typo));
    }
  }
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      visible != nullptr && (std::string(visible).empty() || std::string(visible) == "-1")) {
    checks.push_back({"CUDA_VISIBLE_DEVICES", Outcome::kWarning,
                      std::string("set to '") + visible + "', which hides every NVIDIA GPU", std::nullopt});
  }
  return checks;
}

// Warns where the compiler torch's inductor uses would give the libraries it builds a C++ runtime of
// their own (compiler_runtime.h); a machine without a compiler has nothing that could.
Check compiler_runtime_check() {
  const CompilerRuntime probe = probe_compiler_runtime(inductor_compiler_from_environment());
  const std::string& cxx = probe.compiler;
  switch (probe.kind) {
    case CompilerRuntime::Kind::shared:
      return {"C++ compiler runtime", Outcome::kOk,
              cxx + " links the shared C++ runtime into the libraries it builds, as torch's own libraries do",
              std::nullopt};
    case CompilerRuntime::Kind::copied:
      return {"C++ compiler runtime", Outcome::kWarning,
              cxx + " copies libstdc++ into the shared libraries it builds: a Python process that loads one (an "
                    "AOTInductor package, a torch.utils.cpp_extension module) then has two C++ runtimes and can "
                    "crash (docs/device-sdk.md). `torchbridge export --format aoti` links torch's libstdc++ "
                    "instead; elsewhere set CXX to a compiler that links it dynamically",
              std::nullopt};
    case CompilerRuntime::Kind::no_compiler:
      if (const char* set = std::getenv("CXX"); set != nullptr && *set != '\0') {  // a setting that is wrong
        return {"C++ compiler runtime", Outcome::kWarning,
                "CXX names a compiler that cannot be started (" + probe.detail + "); torch's inductor uses it",
                std::nullopt};
      }
      return {"C++ compiler runtime", Outcome::kOk,
              "no C++ compiler here (" + probe.detail + "): torch.compile's CPU kernels and AOTInductor need one; "
                  "nothing built here can carry a runtime of its own",
              std::nullopt};
    case CompilerRuntime::Kind::unknown:
      break;
  }
  return {"C++ compiler runtime", Outcome::kWarning, "could not tell for " + cxx + ": " + probe.detail, std::nullopt};
}

}  // namespace

int run_doctor(const std::vector<std::string>& args) {
  const ParsedArguments parsed = parse_arguments("doctor", args, {{"--json"}, {"--backend"}});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  const auto& cuda = at::detail::getCUDAHooks();
  const bool cuda_built = cuda.isBuilt() && !cuda.hasROCM();
  const bool rocm_built = cuda.isBuilt() && cuda.hasROCM();
  const bool xpu_built = at::detail::getXPUHooks().isBuilt();
  const bool mps_built = at::detail::getMPSHooks().isBuilt();
  const bool cxx11_abi = _GLIBCXX_USE_CXX11_ABI == 1;

  std::vector<Check> checks = library_checks();
  for (auto& c : backend_checks(parsed.option("--backend"))) checks.push_back(std::move(c));
  checks.push_back(sdk_device_check());
  checks.push_back(compiler_runtime_check());
  nlohmann::json overrides;
  for (auto& c : environment_checks(overrides)) checks.push_back(std::move(c));

  Outcome overall = Outcome::kOk;
  for (const auto& c : checks) overall = std::max(overall, c.outcome);
  const int exit_code = overall == Outcome::kOk ? 0 : overall == Outcome::kFailure ? 1 : 2;

  if (parsed.has("--json")) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& c : checks) {
      list.push_back({{"name", c.name},
                      {"outcome", outcome_name(c.outcome)},
                      {"detail", c.detail},
                      {"duration_ms", c.duration_ms ? nlohmann::json(*c.duration_ms) : nlohmann::json(nullptr)}});
    }
    const nlohmann::json out = {
        {"schema_version", 1},
        {"torchbridge_version", library_version()},
        {"torch",
         {{"version", TORCH_VERSION},
          {"compiled", {{"cuda", cuda_built}, {"rocm", rocm_built}, {"xpu", xpu_built}, {"mps", mps_built}}},
          {"cuda_runtime_version", cuda_built ? nlohmann::json(cuda.versionCUDART()) : nlohmann::json(nullptr)},
          {"cxx11_abi", cxx11_abi},
          {"build_config", at::show_config()}}},
        {"environment_overrides", overrides},
        {"checks", list},
        {"outcome", outcome_name(overall)},
        {"exit_code", exit_code}};
    std::cout << printable_json(out, 2) << "\n";
    return exit_code;
  }

  std::cout << "TorchBridge " << library_version() << " doctor\n\n"
            << "torch " << TORCH_VERSION << ": CUDA " << yes_no(cuda_built) << ", ROCm " << yes_no(rocm_built)
            << ", XPU " << yes_no(xpu_built) << ", MPS " << yes_no(mps_built) << "; C++ ABI "
            << (cxx11_abi ? "cxx11" : "pre-cxx11") << "\n";
  std::cout << "environment overrides: " << (overrides.empty() ? "none" : printable_json(overrides)) << "\n\n";
  for (const auto& c : checks) {
    std::string timing;
    if (c.duration_ms) {
      char buffer[32];
      std::snprintf(buffer, sizeof(buffer), " (%.2f ms)", *c.duration_ms);
      timing = buffer;
    }
    std::cout << column(outcome_name(c.outcome), 9) << column(c.name, 24) << c.detail << timing << "\n";
  }
  std::cout << "\nresult: " << outcome_name(overall) << "\n";
  return exit_code;
}

}  // namespace torchbridge::cli

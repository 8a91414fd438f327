#pragma once
// TorchBridgeConfig: one description of how a program wants to run — which backend, which
// precision, how far to optimize, training or inference — from presets, a JSON or TOML file and
// environment variables. The Python package's TorchBridgeConfig dataclass has the same fields and
// reads and validates through this code, so both front ends accept exactly the same documents.

#include <torchbridge/backend.h>
#include <torchbridge/optimize/hardware_config.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace torchbridge {

struct TorchBridgeConfig {
  // Registry name or alias ("cuda", "nvidia", "emu", ...), or "auto": the best backend here
  // (BackendRegistry::detect_best_backend, which itself honours TORCHBRIDGE_BACKEND).
  std::string backend = "auto";
  int device_index = 0;
  // "auto" or a precision name (fp64, fp32, tf32, bf16, fp16, fp8), decided per device by the
  // precision policy (precision_policy.h): never silently downgraded.
  std::string precision = "auto";
  // O0 place only; O1 precision-neutral rewrites; O2 + mixed precision and compilation;
  // O3 + FP8 and inference-only transforms (docs/optimization.md).
  OptLevel optimization_level = OptLevel::O2;
  // Training keeps fp32 master weights under autocast; inference may cast or quantize weights.
  bool training = true;
  // O2 and up: compile the model where the front end can (Python: torch.compile).
  bool compile = true;
  // torch.use_deterministic_algorithms(true), and no timing-based kernel choice (cuDNN benchmark).
  bool deterministic = false;
  // optimize() given example inputs compares the optimized model's outputs with the original
  // model's in float64 on the CPU, under the precision's output bound; outside it is an error.
  bool validation = false;
  // Memory: training recomputes activations instead of keeping them (memory/activation_checkpoint.h).
  // Python: each block of the model's first nn.Sequential or nn.ModuleList of two or more becomes
  // a checkpointed region; C++ modules put their blocks in memory::CheckpointedSequential.
  bool activation_checkpointing = false;
  // Vendor sections: hardware.nvidia, hardware.amd, hardware.intel, hardware.tpu
  // (hardware_config.h). In files: nested objects ({"hardware": {"nvidia": {...}}}), TOML tables
  // ([hardware.nvidia]) or dotted keys; in the environment: TORCHBRIDGE_HARDWARE_NVIDIA_FP8_ENABLED, ...
  HardwareConfig hardware;

  static TorchBridgeConfig for_training();     // auto precision, O2, compile
  static TorchBridgeConfig for_inference();    // auto precision, O3, compile, inference transforms
  static TorchBridgeConfig for_development();  // fp32, O0, deterministic, validated, nothing compiled
};

// One row per field: its name in files and JSON (dotted for the vendor sections:
// "hardware.nvidia.fp8_enabled"), its type ("string", "integer", "number", "boolean", "level"), the
// environment variable that overrides it, and what it does.
struct ConfigField {
  const char* name;
  const char* type;
  const char* environment;
  const char* description;
};
const std::vector<ConfigField>& config_schema();

// Raises c10::ValueError for any field out of its domain: unknown precision names, unknown
// backends (asked of the registry without loading anything), negative device indices.
void validate(const TorchBridgeConfig& config);

// Reading is strict: unknown keys (with the closest valid one suggested), wrong types and invalid
// values raise c10::ValueError naming `source`, the key and what was expected. Keys absent from the
// document keep `base`'s values.
TorchBridgeConfig config_from_json_text(std::string_view json, const TorchBridgeConfig& base = {},
                                        std::string_view source = "configuration");
std::string to_json_text(const TorchBridgeConfig& config, int indent = -1);
// A .json or .toml file (TOML: `key = value` lines with strings, integers and booleans, comments
// and blank lines — the subset this flat schema needs; anything else is refused by line number).
TorchBridgeConfig load_config(const std::string& path, const TorchBridgeConfig& base = {});

// `config` with every field whose environment variable is set (and not empty) replaced by its
// value, parsed and validated like a file's. `getenv` is injectable for tests.
TorchBridgeConfig with_environment(TorchBridgeConfig config,
                                   const std::function<const char*(const char*)>& getenv = nullptr);

}  // namespace torchbridge

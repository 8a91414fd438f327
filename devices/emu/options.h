// Options of the emulated device, read once from TORCHBRIDGE_EMU_* environment variables.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace torchbridge::emu {

// Deliberately broken behaviours, so tests can prove that a check is able to fail.
enum class FaultMode {
  none,
  drop_copy,     // the first host->device copy of >= 64 bytes is skipped but reports success
  corrupt_copy,  // the first device->host copy of >= 64 bytes arrives with one byte flipped
  leak,          // device_free succeeds but the bytes never return to the free pool
};

const char* fault_mode_name(FaultMode mode);

struct EmuOptions {
  int device_count = 2;                                  // TORCHBRIDGE_EMU_DEVICES
  std::uint64_t memory_capacity_bytes = std::uint64_t{1} << 30;  // TORCHBRIDGE_EMU_MEMORY
  bool guarded = true;                                   // TORCHBRIDGE_EMU_GUARDED
  std::chrono::microseconds latency{0};                  // TORCHBRIDGE_EMU_LATENCY_US
  FaultMode fault = FaultMode::none;                     // TORCHBRIDGE_EMU_FAULT
};

// Either options, or a sentence naming the variable, its bad value and what is expected.
struct OptionsOrError {
  std::optional<EmuOptions> options;
  std::string error;
};

// Reads the environment through `lookup` (getenv by default, so a caller can supply fixed values).
OptionsOrError read_options(const char* (*lookup)(const char* name) = nullptr);

}  // namespace torchbridge::emu

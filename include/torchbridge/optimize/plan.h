#pragma once
// What an optimization level does to one model on one device, decided once in C++ for both front
// ends: every step of every level up to the configured one, with whether it applies here and why.
// The executors (C++ UnifiedManager, the Python package's UnifiedManager) carry the plan out and
// may only turn an applying step into a skipped one, stating why (for instance when torch refuses
// a fused optimizer on the device); they never add steps of their own.

#include <torchbridge/backend.h>
#include <torchbridge/device_info.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/precision_policy.h>

#include <string>
#include <vector>

namespace torchbridge {

// What the plan needs to know about the model and the program around it.
struct ModelTraits {
  bool python = false;            // the Python package executes (it can compile and wrap forward)
  bool torchscript = false;       // a TorchScript module
  bool has_convolutions = false;  // a 2-D convolution somewhere (channels-last pays off)
  bool has_linear = false;        // a Linear layer somewhere (FP8 and int8 weights apply to those)
  // Python: an nn.Linear the int8 weight-only kernel can run (in_features a multiple of 16, no
  // hooks). Without one, int8_weights quantizes nothing and leaves compile to apply.
  bool has_int8_linear = false;
  std::string optimizer;          // the optimizer's class name ("Adam", "AdamW", "SGD", ...), "" for none
  bool has_example_inputs = false;  // optimize() was given inputs to validate with
  // Python: an nn.Sequential or nn.ModuleList of two or more blocks, which the executor checkpoints
  // block by block. Without one, activation checkpointing does not apply (and compile may).
  bool has_block_container = false;
};

struct PlannedStep {
  std::string name;   // place, deterministic, activation_checkpointing, hardware.<vendor>.<field> (one per vendor setting away
                      // from its default), tf32, cudnn_benchmark, fused_optimizer, channels_last,
                      // freeze_torchscript, autocast, low_precision_weights, fp8, compile, int8_weights,
                      // validate (always last: it checks the result of the others)
  OptLevel level;     // the lowest level the step belongs to
  bool apply;
  std::string reason;  // what it does here, or why it does not apply
  // Set on steps that apply: the dtype autocast and weight casts use, the compile backend.
  std::string argument;
};

std::vector<PlannedStep> plan_optimization(const TorchBridgeConfig& config, const DeviceInfo& device,
                                           const PrecisionDecision& precision, const ModelTraits& model);

}  // namespace torchbridge

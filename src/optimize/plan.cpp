#include <torchbridge/optimize/plan.h>

#include <torchbridge/optimize/hardware_config.h>
#include <torchbridge/precision.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

bool is_gpu(const DeviceInfo& device) { return device.backend == "cuda" || device.backend == "rocm"; }

bool low_precision(Precision p) { return p == Precision::kBf16 || p == Precision::kFp16 || p == Precision::kFp8; }

// The dtype autocast computes in: fp8 layers take their own path, everything around them bf16.
std::string autocast_dtype(Precision p) { return p == Precision::kFp16 ? "float16" : "bfloat16"; }

bool explicitly_full_precision(const TorchBridgeConfig& config) {
  return config.precision == "fp32" || config.precision == "fp64";
}

class Planner {
 public:
  Planner(const TorchBridgeConfig& config, const DeviceInfo& device, const PrecisionDecision& precision,
          const ModelTraits& model)
      : config_(config), device_(device), precision_(precision.precision), support_(precision.support), model_(model) {}

  std::vector<PlannedStep> plan() {
    add("place", OptLevel::O0, true, "parameters and buffers on " + device_.backend + ":" +
                                         std::to_string(device_.index));
    add("deterministic", OptLevel::O0, config_.deterministic,
        config_.deterministic ? "deterministic algorithms only (torch raises for an operator without one)"
                              : "deterministic is off in the configuration");
    plan_activation_checkpointing();
    // Vendor settings apply at every level; each one set away from its default says what it does here.
    for (HardwareNote& note : hardware_notes(config_.hardware, device_)) {
      std::string argument;  // what the executors need beyond the name
      if (note.field == "hardware.nvidia.flash_attention_version") {
        argument = config_.hardware.nvidia.flash_attention_version;
      } else if (note.field == "hardware.amd.memory_pool_size_gb") {
        argument = std::to_string(config_.hardware.amd.memory_pool_size_gb);
      }
      add(note.field, OptLevel::O0, note.applies, std::move(note.detail), std::move(argument));
    }
    plan_o1();
    plan_o2_o3();
    plan_validate();
    return steps_;
  }

 private:
  void add(std::string name, OptLevel level, bool apply, std::string reason, std::string argument = "") {
    if (level > config_.optimization_level) return;
    steps_.push_back({std::move(name), level, apply, std::move(reason), apply ? std::move(argument) : ""});
  }

  void plan_o1() {
    if (!device_.features.tf32) {
      add("tf32", OptLevel::O1, false, "the device has no TF32 units");
    } else if (explicitly_full_precision(config_)) {
      add("tf32", OptLevel::O1, false, config_.precision + " was requested explicitly; TF32 would round matmul inputs");
    } else {
      add("tf32", OptLevel::O1, true, "float32 matmuls and convolutions on TF32 tensor cores (process-wide setting)");
    }
    if (!is_gpu(device_)) {
      add("cudnn_benchmark", OptLevel::O1, false, "no cuDNN or MIOpen on " + device_.backend);
    } else if (config_.deterministic) {
      add("cudnn_benchmark", OptLevel::O1, false, "deterministic: benchmark mode chooses kernels by timing");
    } else {
      add("cudnn_benchmark", OptLevel::O1, true, "convolution algorithms chosen by timing (process-wide setting)");
    }
    plan_fused_optimizer();
    add("channels_last", OptLevel::O1, model_.has_convolutions,
        model_.has_convolutions ? "4-D parameters in channels-last memory format for the convolutions"
                                : "the model has no 2-D convolution");
    if (!model_.torchscript) {
      add("freeze_torchscript", OptLevel::O1, false, "the model is not a TorchScript module");
    } else if (config_.training) {
      add("freeze_torchscript", OptLevel::O1, false, "training: freezing turns parameters into constants");
    } else {
      add("freeze_torchscript", OptLevel::O1, true, "frozen (parameters inlined) and optimized for inference");
    }
  }

  void plan_fused_optimizer() {
    static constexpr std::array<const char*, 4> kFused = {"Adam", "AdamW", "SGD", "Adagrad"};
    if (model_.optimizer.empty()) {
      add("fused_optimizer", OptLevel::O1, false, "no optimizer was given");
    } else if (!model_.python) {
      add("fused_optimizer", OptLevel::O1, false, "LibTorch's optimizers have no fused implementation");
    } else if (config_.training && precision_ == Precision::kFp16 && config_.optimization_level >= OptLevel::O2) {
      // fp16 training scales the loss; torchbridge.amp.GradScaler drives unfused optimizers only
      // (a fused step reads the scaler's tensors inside the kernel). Below O2 nothing autocasts, so
      // the model trains in its own dtype and needs no scaler.
      add("fused_optimizer", OptLevel::O1, false, "fp16 training needs a GradScaler, and torchbridge.amp.GradScaler "
                                                  "steps unfused optimizers");
    } else if (std::find(kFused.begin(), kFused.end(), model_.optimizer) == kFused.end()) {
      add("fused_optimizer", OptLevel::O1, false, "torch has no fused " + model_.optimizer);
    } else {
      add("fused_optimizer", OptLevel::O1, true, model_.optimizer + " rebuilt with fused=True: one kernel updates every parameter");
    }
  }

  void plan_o2_o3() {
    const bool training = config_.training;
    const bool int8 = !training && device_.backend == "cpu" && precision_ == Precision::kBf16 &&
                      model_.has_int8_linear && model_.python && !model_.torchscript;
    if (!low_precision(precision_)) {
      add("autocast", OptLevel::O2, false, std::string("precision is ") + name_of(precision_) + ": nothing to autocast");
    } else if (model_.torchscript) {
      add("autocast", OptLevel::O2, false, "TorchScript modules run in the dtypes they were scripted with");
    } else {
      add("autocast", OptLevel::O2, true,
          "forward under autocast(" + device_.backend + ", " + autocast_dtype(precision_) + ")" +
              (training ? "; parameters stay float32 (master weights)" : "") +
              (training && precision_ == Precision::kFp16 ? "; scale the loss with a GradScaler" : ""),
          autocast_dtype(precision_));
    }
    if (training) {
      add("low_precision_weights", OptLevel::O2, false, "training keeps float32 master weights");
    } else if (model_.torchscript) {
      add("low_precision_weights", OptLevel::O2, false, "TorchScript modules run in the dtypes they were scripted with");
    } else if (!low_precision(precision_)) {
      add("low_precision_weights", OptLevel::O2, false, std::string("precision is ") + name_of(precision_));
    } else {
      add("low_precision_weights", OptLevel::O2, true,
          "inference: floating-point parameters and buffers cast to " + autocast_dtype(precision_) + " (half the memory)",
          autocast_dtype(precision_));
    }
    plan_fp8();
    plan_compile(int8);  // after the layer swaps, so the compiled forward calls the new layers
    plan_int8(int8);
  }

  // After low_precision_weights: the FP8 layers' scaling state is created float32 and stays so.
  void plan_fp8() {
    const bool asked_by_hardware_section =
        config_.hardware.nvidia.fp8_enabled && device_.backend == "cuda" && device_.features.fp8;
    if (precision_ != Precision::kFp8 && !asked_by_hardware_section) {
      // The switch may be on for a device that is not an NVIDIA GPU with FP8 units: say so, not "off".
      const std::string hardware_section =
          config_.hardware.nvidia.fp8_enabled
              ? "hardware.nvidia.fp8_enabled is on, but this device (" + device_.backend +
                    ") is not an NVIDIA GPU with FP8 matrix units (sm_89 or later)"
              : "hardware.nvidia.fp8_enabled is off";
      add("fp8", OptLevel::O3, false,
          std::string("precision is ") + name_of(precision_) + ", not fp8, and " + hardware_section);
    } else if (model_.torchscript) {
      add("fp8", OptLevel::O3, false,
          "TorchScript modules cannot have their Linear layers swapped; build the model with amp::Fp8Linear");
    } else if (!model_.has_linear) {
      add("fp8", OptLevel::O3, false, "the model has no Linear layer");
    } else {
      add("fp8", OptLevel::O3, true,
          "Linear layers with dimensions divisible by 16 become FP8 layers (e4m3 forward, e5m2 gradients, delayed "
          "scaling); autocast runs the rest");
    }
  }

  // A memory setting, so any level: the recomputation trades compute for activation memory.
  void plan_activation_checkpointing() {
    if (!config_.activation_checkpointing) {
      add("activation_checkpointing", OptLevel::O0, false, "activation_checkpointing is off in the configuration");
    } else if (!config_.training) {
      add("activation_checkpointing", OptLevel::O0, false, "inference: no backward pass, no activations kept");
    } else if (model_.torchscript) {
      add("activation_checkpointing", OptLevel::O0, false,
          "a TorchScript module's forward is compiled and cannot be split into regions; checkpoint inside the "
          "scripted code's caller (torchbridge::memory::checkpoint)");
    } else if (model_.python && !model_.has_block_container) {
      add("activation_checkpointing", OptLevel::O0, false,
          "no nn.Sequential or nn.ModuleList of two or more blocks to checkpoint; call torchbridge.memory.checkpoint "
          "in the model's forward");
    } else {
      checkpointing_ = true;
      add("activation_checkpointing", OptLevel::O0, true,
          "each block's activations are recomputed in backward instead of kept (torchbridge::memory::checkpoint)");
    }
  }

  void plan_compile(bool int8) {
    if (!config_.compile) {
      add("compile", OptLevel::O2, false, "compile is off in the configuration");
    } else if (checkpointing_) {
      add("compile", OptLevel::O2, false,
          "activation checkpointing runs through TorchBridge's own autograd node, which torch.compile cannot "
          "trace; turn one of them off");
    } else if (!model_.python) {
      add("compile", OptLevel::O2, false, "C++ has no compiler for torch::nn modules; load an AOTInductor package with UnifiedManager::load_compiled");
    } else if (model_.torchscript) {
      add("compile", OptLevel::O2, false, "TorchScript modules are compiled by TorchScript");
    } else if (int8 && config_.optimization_level >= OptLevel::O3) {
      add("compile", OptLevel::O2, false, "the int8 weight-only kernel is called directly; inductor would decompose it");
    } else if (device_.backend == "cuda" && precision_ == Precision::kBf16 && support_ == PrecisionSupport::kEmulated) {
      // torch/_inductor/compile_fx.py (_check_triton_bf16_support) warns and skips every such frame.
      add("compile", OptLevel::O2, false,
          "inductor compiles no bfloat16 graph on NVIDIA GPUs below sm_80 (torch skips the frame and runs it "
          "eagerly); bf16 is emulated here");
    } else {
      // inductor generates code for the devices it has backends for; other devices get
      // aot_eager, which traces and partitions forward/backward but runs torch's own kernels.
      const bool inductor = device_.backend == "cpu" || is_gpu(device_) || device_.backend == "xpu";
      add("compile", OptLevel::O2, true,
          std::string("torch.compile with the ") + (inductor ? "inductor" : "aot_eager") + " backend",
          inductor ? "inductor" : "aot_eager");
    }
  }

  void plan_int8(bool int8) {
    if (config_.training) {
      add("int8_weights", OptLevel::O3, false, "training: int8 weights are for inference");
    } else if (device_.backend != "cpu") {
      add("int8_weights", OptLevel::O3, false, "torch's int8 weight-only matmul is used on the CPU only");
    } else if (precision_ != Precision::kBf16) {
      add("int8_weights", OptLevel::O3, false,
          "the CPU's int8 weight-only matmul is fast with bfloat16 activations only; precision is " +
              std::string(name_of(precision_)));
    } else if (!model_.python) {
      add("int8_weights", OptLevel::O3, false, "the C++ front end has no int8 Linear module yet");
    } else if (model_.torchscript) {
      add("int8_weights", OptLevel::O3, false,
          "TorchScript modules cannot have their Linear layers swapped; they run in the dtypes they were "
          "scripted with");
    } else {
      add("int8_weights", OptLevel::O3, int8,
          int8 ? "Linear weights stored as int8 with a scale per output row (torch._weight_int8pack_mm)"
          : model_.has_linear ? "no Linear layer the int8 kernel can run (in_features a multiple of 16, no hooks)"
                              : "the model has no Linear layer");
    }
  }

  void plan_validate() {
    if (!config_.validation) {
      add("validate", OptLevel::O0, false, "validation is off in the configuration");
    } else if (!model_.python) {
      add("validate", OptLevel::O0, false,
          "C++ modules have no forward a library can call; validate with torchbridge::validation::Validator");
    } else if (!model_.has_example_inputs) {
      add("validate", OptLevel::O0, false, "no example inputs were given to optimize()");
    } else {
      add("validate", OptLevel::O0, true,
          std::string("outputs in eval mode against the original model in float64 on the CPU, within the ") +
              name_of(precision_) + " output bound");
    }
  }

  const TorchBridgeConfig& config_;
  const DeviceInfo& device_;
  Precision precision_;
  PrecisionSupport support_;  // native or emulated
  const ModelTraits& model_;
  std::vector<PlannedStep> steps_;
  bool checkpointing_ = false;  // the activation_checkpointing step applies (it keeps compile off)
};

}  // namespace

std::vector<PlannedStep> plan_optimization(const TorchBridgeConfig& config, const DeviceInfo& device,
                                           const PrecisionDecision& precision, const ModelTraits& model) {
  return Planner(config, device, precision, model).plan();
}

}  // namespace torchbridge

// `torchbridge export`: a built-in model or TorchScript file written as TorchScript or as a
// safetensors state dict, verified by reading it back. ONNX needs torch.onnx (Python): the
// Python package's `torchbridge export` serves it.
#include "arguments.h"
#include "commands.h"
#include "model_argument.h"
#include "text_format.h"

#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/error_summary.h>
#include <torchbridge/module_state.h>
#include <torchbridge/validation/validator.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kHelp = R"(usage: torchbridge export --model builtin:NAME|FILE --format FORMAT --output PATH
                          [--input-shape SHAPE]

Writes the model and verifies the file by reading it back:
  torchscript   a TorchScript module (torch::jit::load / torch.jit.load); its outputs (a tensor,
                or tuples and lists of them) on a random input of --input-shape (default for
                built-in models: their own) must be identical, NaN matching NaN
  safetensors   the parameters and buffers as a safetensors state dict; every tensor must read
                back bit for bit. Tied weights are stored once, the other names in the
                metadata's torchbridge.tied_weights (JSON: name -> stored name)
  exported      a torch.export program (.pt2, torch.export.save); torch.jit's successor. Its
                outputs on a random input of --input-shape must be identical
  aoti          an AOTInductor package (.pt2) compiled for the CPU, which C++ runs with
                torchbridge::CompiledModel; outputs within rtol 1e-4, atol 1e-5 (its own kernels)
  onnx          an ONNX graph, checked in onnxruntime
The last three need torch.export / torch.onnx, i.e. Python: the Python package's `torchbridge
export` (pip install . from the repository) runs them; torchbridge.deployment has them as
functions (export_to_exported_program, export_to_aoti, export_to_onnx).
)";

// The verification runs in eval mode, whatever mode the model was saved in: in training mode
// batch norm would update its running statistics (a forward pass on random data changing the
// model) and dropout would draw other masks in the two runs. The mode is put back after.
class EvalMode {
 public:
  explicit EvalMode(torch::jit::Module& module) : module_(module), training_(module.is_training()) { module_.eval(); }
  ~EvalMode() { module_.train(training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::jit::Module& module_;
  bool training_;
};

std::vector<at::Tensor> outputs_of(torch::jit::Module& module, const std::vector<at::Tensor>& inputs) {
  torch::jit::GraphOptimizerEnabledGuard unoptimized(false);  // the same graph for both runs
  at::NoGradGuard no_grad;
  const EvalMode eval_mode(module);
  // Each run on its own copy: a model that changes its input in place changed the next run's.
  std::vector<c10::IValue> fresh;
  for (const auto& input : inputs) fresh.emplace_back(input.clone());
  return validation::output_tensors(module.forward(fresh));
}

// Equal as torch.testing.assert_close(rtol=0, atol=0, equal_nan=True) has it: the same shapes and
// dtypes, every element equal or NaN on both sides (at::equal's NaN != NaN made a model whose
// output holds a NaN impossible to export).
bool identical_outputs(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return false;
    const at::Tensor same = a[i].eq(b[i]).logical_or_(a[i].isnan().logical_and_(b[i].isnan()));
    if (!same.all().item<bool>()) return false;
  }
  return true;
}

// A path beside `output` that names no existing file (the model itself, or a file of the user's).
std::string unused_path_beside(const std::string& output) {
  const std::string stem = output + ".partial-" + std::to_string(::getpid());
  std::string candidate = stem;
  std::error_code no_file;
  for (int n = 1; std::filesystem::exists(candidate, no_file); ++n) candidate = stem + "-" + std::to_string(n);
  return candidate;
}

// TorchScript: written beside the target and renamed over it, so a failed export leaves no file.
// The module is saved before it runs, so the file holds it exactly as it was given.
void export_torchscript(torch::jit::Module& module, const std::string& output, const std::vector<at::Tensor>& inputs) {
  const std::string temporary = unused_path_beside(output);
  // Removed on every way out but the rename (a failed save or reload left it behind).
  const std::unique_ptr<const std::string, void (*)(const std::string*)> remove_temporary(
      &temporary, [](const std::string* path) {
        std::error_code ignored;
        std::filesystem::remove(*path, ignored);
      });
  module.save(temporary);
  torch::jit::Module reloaded = torch::jit::load(temporary);
  std::vector<at::Tensor> expected;
  try {
    expected = outputs_of(module, inputs);
  } catch (const std::exception& e) {  // c10::Error, or TorchScript's JITException
    // The model's own error names no input ("mat1 and mat2 shapes cannot be multiplied").
    std::string shapes;
    for (const auto& input : inputs) shapes += (shapes.empty() ? "" : "; ") + c10::str(input.sizes());
    throw UsageError("the model does not run on random inputs of shape " + shapes + " (--input-shape): " +
                     error_summary(e.what()));
  }
  if (!identical_outputs(outputs_of(reloaded, inputs), expected)) {
    throw std::runtime_error("the reloaded TorchScript module's outputs differ from the model's; nothing written");
  }
  std::filesystem::rename(temporary, output);
}

// Tied weights are stored once, under their first name, with "torchbridge.tied_weights" mapping
// each other name to it (JSON), as the Python package's export_to_safetensors writes them.
// Returns how many names were tied to another.
size_t export_safetensors(const torch::jit::Module& module, const std::string& output, const std::string& label) {
  const UntiedState state = store_tied_once(module_state(module));
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"torchbridge.model", label}};
  if (!state.tied.empty()) metadata["torchbridge.tied_weights"] = nlohmann::json(state.tied).dump();
  checkpoint::save(output, state.stored, metadata);
  const auto file = checkpoint::SafetensorsFile::open(output);
  for (const auto& [name, tensor] : state.stored) {
    const at::Tensor back = file.load(name);
    const at::Tensor original = tensor.detach().cpu().contiguous();
    if (back.sizes() != original.sizes() || std::memcmp(back.data_ptr(), original.data_ptr(), original.nbytes()) != 0) {
      throw std::runtime_error("tensor '" + name + "' did not read back bit for bit from " + output);
    }
  }
  return state.tied.size();
}

}  // namespace

int run_export(const std::vector<std::string>& args) {
  const ParsedArguments parsed =
      parse_arguments("export", args, {{}, {"--model", "--format", "--output", "--input-shape"}, false});
  if (parsed.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  for (const char* required : {"--model", "--format", "--output"}) {
    if (!parsed.option(required)) throw UsageError(std::string("export needs ") + required + " (see --help)");
  }
  const std::string& format = *parsed.option("--format");
  const std::string& output = *parsed.option("--output");
  if (format == "onnx" || format == "exported" || format == "aoti") {
    throw UsageError("--format " + format + " needs " + (format == "onnx" ? "torch.onnx" : "torch.export") +
                     ", which only Python has: run the Python package's `torchbridge export` (pip install . from "
                     "the repository) or torchbridge.deployment");
  }
  if (format != "torchscript" && format != "safetensors") {
    throw UsageError("--format '" + format + "' is not one of torchscript, safetensors, exported, aoti, onnx");
  }
  if (format == "safetensors" && parsed.option("--input-shape")) {
    throw UsageError("--input-shape is not used by --format safetensors (it writes tensors, running nothing); "
                     "it sets the sample input of the other formats");
  }
  check_output_file(output, "--output");
  std::error_code no_file;
  if (std::filesystem::equivalent(*parsed.option("--model"), output, no_file)) {
    throw UsageError("--output '" + output + "' is the --model file itself; write the export to another path");
  }
  ModelArgument model = load_model_argument(*parsed.option("--model"));
  std::string tied_note;
  if (format == "safetensors") {
    const size_t tied = export_safetensors(model.module, output, model.label);
    if (tied > 0) tied_note = "; " + std::to_string(tied) + " tied weights stored once (torchbridge.tied_weights)";
  } else {
    // The written file is verified on a sample input.
    const auto shapes = input_shapes_for(model, parsed.option("--input-shape"), "--format torchscript");
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(0);
    std::vector<at::Tensor> inputs;
    for (const auto& shape : shapes) inputs.push_back(at::randn(shape, generator, at::TensorOptions()));
    export_torchscript(model.module, output, inputs);
  }
  std::cout << "wrote " << output << " (" << format << ", " << model.label << "), verified by reading it back"
            << tied_note << "\n";
  return 0;
}

}  // namespace torchbridge::cli

#include "model_argument.h"

#include "arguments.h"
#include "text_format.h"

#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/error_summary.h>
#include <torchbridge/validation/builtin_models.h>
#include <torchbridge/validation/validator.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import.h>

#include <filesystem>

namespace torchbridge::cli {

namespace {

// What a file that is no TorchScript module is, when it is a format users export models to, with
// the way to what --model reads; empty otherwise. torch's own error called each of these
// "corrupted" ("PytorchStreamReader failed locating file constants.pkl").
std::string other_model_format(const std::string& path) {
  const std::string script_it =
      "; --model reads TorchScript (torch.jit.script or torch.jit.trace, then torch.jit.save)";
  if (path.ends_with(".onnx")) return "an ONNX model, which torch does not run" + script_it;
  if (checkpoint::is_torch_save_file(path)) {
    try {
      caffe2::serialize::PyTorchStreamReader archive(path);
      for (const auto& record : archive.getAllRecords()) {
        if (record.find("archive_format") != std::string::npos || record.find("models/") != std::string::npos) {
          return "a torch.export program or AOTInductor package (.pt2); an AOTInductor package is checked with "
                 "--compiled beside the model it was compiled from" + script_it;
        }
      }
      return "a torch.save file (a state dict or a pickled model), which holds no program" + script_it;
    } catch (const c10::Error&) {
      return "a torch.save file in the legacy format, which holds no program" + script_it;
    }
  }
  try {
    (void)checkpoint::Checkpoint::open(path);
    return "a safetensors checkpoint, which holds weights but no program" + script_it;
  } catch (const c10::Error&) {
    return "";
  }
}

}  // namespace

ModelArgument load_model_argument(const std::string& spec) {
  const std::string prefix = "builtin:";
  if (spec.rfind(prefix, 0) == 0) {
    const std::string name = spec.substr(prefix.size());
    try {
      const auto& info = validation::builtin_model_info(name);
      return {validation::make_builtin_model(name), spec, info.input_shape};
    } catch (const c10::Error& e) {
      throw UsageError("--model " + spec + ": " + error_summary(e.msg()));
    }
  }
  if (!std::filesystem::is_regular_file(spec)) {
    throw UsageError("--model '" + spec + "' is neither builtin:NAME (mlp, cnn, transformer) nor an existing file");
  }
  try {
    return {torch::jit::load(spec), spec, std::nullopt};
  } catch (const c10::Error& e) {
    const std::string known = other_model_format(spec);
    if (!known.empty()) throw UsageError("--model '" + spec + "' is " + known);
    throw UsageError("--model '" + spec + "' is not a TorchScript module torch can load: " + error_summary(e.msg()));
  }
}

std::vector<std::vector<int64_t>> parse_input_shapes(const std::string& text) {
  std::vector<std::vector<int64_t>> shapes;
  if (text.empty()) throw UsageError("--input-shape is empty: expected e.g. 4,16,32 (inputs separated by ';')");
  try {
    // Every field between separators is a shape, the last one too: getline would drop an empty
    // trailing field, and "4,16;" (a second input forgotten) would pass as one input.
    size_t begin = 0;
    for (size_t end = text.find(';'); ; end = text.find(';', begin)) {
      shapes.push_back(validation::parse_shape(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin)));
      if (end == std::string::npos) break;
      begin = end + 1;
    }
  } catch (const c10::Error& e) {
    throw UsageError("--input-shape '" + text + "': " + error_summary(e.msg()));
  }
  return shapes;
}

std::vector<std::vector<int64_t>> input_shapes_for(const ModelArgument& model, const std::string* option,
                                                   const std::string& needed_for) {
  if (option) return parse_input_shapes(*option);
  if (model.input_shape) return {*model.input_shape};
  throw UsageError("--model '" + model.label + "' is a file: " + needed_for + " needs its input shape; give " +
                   "--input-shape (e.g. 4,16,32)");
}

}  // namespace torchbridge::cli

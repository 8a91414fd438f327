// CompiledModel (include/torchbridge/optimize/compiled_model.h): AOTInductor packages for C++.
#include <torchbridge/optimize/compiled_model.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

// Leaves of a serialized pytree spec ({"type": null, ...} nodes): the flat inputs the package takes.
std::size_t count_leaves(const nlohmann::json& spec) {
  if (spec.is_object() && spec.contains("type") && spec["type"].is_null()) return 1;
  std::size_t leaves = 0;
  if (spec.is_object() && spec.contains("children_spec")) {
    for (const auto& child : spec["children_spec"]) leaves += count_leaves(child);
  }
  return leaves;
}

// What the package says about itself; raises naming the file when it is missing or not a package.
std::map<std::string, std::string> package_metadata(const std::string& package_path) {
  TORCH_CHECK_VALUE(std::filesystem::is_regular_file(package_path), "AOTInductor package '", package_path,
                    "' does not exist or is not a file");
  std::unordered_map<std::string, std::string> metadata;
  try {
    metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(package_path, "model");
  } catch (const std::exception& e) {
    // A zip without an AOTInductor model: a torch.export program (also .pt2), any other archive.
    std::string reason = e.what();
    reason = reason.substr(0, reason.find('\n'));
    TORCH_CHECK_VALUE(false, "'", package_path, "' is not an AOTInductor package (", reason,
                      "); a torch.export program (torch.export.save) is also a .pt2 but holds no compiled model: "
                      "compile one with torch._inductor.aoti_compile_and_package");
  }
  const auto key = metadata.find("AOTI_DEVICE_KEY");
  TORCH_CHECK_VALUE(key != metadata.end(), "'", package_path, "' has no AOTI_DEVICE_KEY: not an AOTInductor package");
  return {metadata.begin(), metadata.end()};
}

}  // namespace

namespace {

// The device a package runs on when none is named: its device type, index 0 where devices have
// indices (AOTInductor's CPU runner refuses a CPU device with one).
c10::Device default_device_of(const std::string& package_path) {
  const c10::Device type(package_metadata(package_path).at("AOTI_DEVICE_KEY"));
  return type.is_cpu() ? type : c10::Device(type.type(), 0);
}

}  // namespace

CompiledModel::CompiledModel(const std::string& package_path)
    : CompiledModel(package_path, default_device_of(package_path)) {}

CompiledModel::CompiledModel(const std::string& package_path, c10::Device device)
    : device_(device), path_(package_path) {
  metadata_ = package_metadata(package_path);
  // The generated code checks every input's device, dtype and shape only when this is set; it reads
  // it once. An explicit setting by the user wins.
  setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/0);
  const auto key = metadata_.find("AOTI_DEVICE_KEY");
  TORCH_CHECK_VALUE(key->second == c10::DeviceTypeName(device.type(), /*lower_case=*/true),
                    "AOTInductor package '", package_path, "' was compiled for ", key->second, ", not for ", device,
                    "; compile it on a machine with that device (torch._inductor.aoti_compile_and_package)");
  loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
      package_path, "model", /*run_single_threaded=*/false, /*num_runners=*/1,
      device.has_index() ? device.index() : static_cast<c10::DeviceIndex>(-1));
  const std::vector<std::string> call_spec = loader_->get_call_spec();
  TORCH_CHECK(!call_spec.empty(), "AOTInductor package '", package_path, "' has no call spec");
  const nlohmann::json in_spec = nlohmann::json::parse(call_spec[0]);  // [version, spec]
  input_count_ = count_leaves(in_spec.at(1));
}

CompiledModel::~CompiledModel() = default;
CompiledModel::CompiledModel(CompiledModel&&) noexcept = default;
CompiledModel& CompiledModel::operator=(CompiledModel&&) noexcept = default;

std::vector<at::Tensor> CompiledModel::run(const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK_VALUE(inputs.size() == input_count_, "AOTInductor package '", path_, "' takes ", input_count_,
                    " input tensor(s), got ", inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK_VALUE(inputs[i].defined() && inputs[i].device().type() == device_.type(), "input ", i, " is on ",
                      inputs[i].defined() ? inputs[i].device().str() : std::string("nothing (undefined)"),
                      "; the package runs on ", device_);
  }
  try {
    return loader_->run(inputs);
  } catch (const std::exception& e) {
    // The generated input checks (AOTI_RUNTIME_CHECK_INPUTS) throw std::runtime_error
    // "input_handles[0]: unmatched ...".
    std::string message = e.what();
    while (!message.empty() && message.back() == '\n') message.pop_back();
    TORCH_CHECK_VALUE(false, "AOTInductor package '", path_, "' refused its inputs: ", message);
  }
}

}  // namespace torchbridge

#pragma once
// An AOTInductor package loaded for a C++ program: O2's compilation step for C++, which has no
// just-in-time compiler for torch::nn modules. The package comes from Python:
//   torch._inductor.aoti_compile_and_package(torch.export.export(model, args), package_path="model.pt2")
// and is loaded through UnifiedManager::load_compiled (manager.h) or directly:
//   torchbridge::CompiledModel model("model.pt2", c10::kCPU);
//   std::vector<at::Tensor> outputs = model.run({x});
//
// A package holds machine code for one device type (and, for CUDA, one compute capability); a
// package for another device type is refused naming both. Inputs are checked before the
// generated code sees them: their number against the package's call spec, and their device,
// dtype and shape by the generated code's own checks (AOTI_RUNTIME_CHECK_INPUTS, switched on
// here), so a wrong input is a c10::Error, not a crash.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace torchbridge {

class CompiledModel {
 public:
  CompiledModel(const std::string& package_path, c10::Device device);
  // On the device type the package was compiled for (its AOTI_DEVICE_KEY): the CPU, or device 0.
  explicit CompiledModel(const std::string& package_path);
  ~CompiledModel();
  CompiledModel(CompiledModel&&) noexcept;
  CompiledModel& operator=(CompiledModel&&) noexcept;

  // The package's outputs for `inputs` (the flattened positional arguments it was exported with).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);

  c10::Device device() const { return device_; }
  std::size_t input_count() const { return input_count_; }
  // What the package says about itself: AOTI_DEVICE_KEY, AOTI_PLATFORM, AOTI_CPU_ISA, ...
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  c10::Device device_;
  std::size_t input_count_ = 0;
  std::map<std::string, std::string> metadata_;
  std::string path_;
};

}  // namespace torchbridge

#pragma once
// Switching a model's torch::nn::Linear layers to Fp8Linear (amp/fp8_linear.h), in place.
//
//   auto report = torchbridge::amp::convert_to_fp8(*model);
//   std::cout << report.summary();  // what was converted, what was left and why
//
// A Linear is converted when in_features and out_features are multiples of 16 (the granularity
// of the FP8 matrix units and of _scaled_mm) and the optional filter accepts it. The new layer
// takes over the Linear's parameter tensors, so optimizers built before the conversion still
// update the model. A Linear registered under several names (an alias, or one layer shared by two
// parents) is decided once, at its first name, and becomes one Fp8Linear at every name.
//
// LibTorch modules call their children through member holders (`fc1(x)`), not through the
// registry, so a registered child can only be swapped where the registry is the only holder, or
// inside a torch::nn::Sequential (whose element list is rewritten too). A Linear that something
// else still holds (a member ModuleHolder, a ModuleList, a caller's copy) is left as it was and
// reported as skipped with that reason: converting it would silently change nothing.

#include <torchbridge/amp/fp8.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
class LinearImpl;
}  // namespace torch::nn

namespace torchbridge::amp {

struct Fp8ConversionOptions {
  DelayedScalingOptions scaling;
  Fp8MatmulKernel kernel = Fp8MatmulKernel::kAuto;
  // Called with each eligible Linear's qualified name ("encoder.2"); false keeps it as it is.
  std::function<bool(const std::string& name, const torch::nn::LinearImpl& linear)> filter;
};

struct Fp8ConversionReport {
  struct Converted {
    std::string name;
    int64_t in_features = 0;
    int64_t out_features = 0;
  };
  struct Skipped {
    std::string name;
    std::string reason;
  };
  // A further name a converted layer is registered under (an alias, or a second parent sharing
  // it), which now holds the same Fp8Linear as `converted_name`.
  struct Alias {
    std::string name;
    std::string converted_name;
  };
  std::vector<Converted> converted;
  std::vector<Skipped> skipped;
  std::vector<Alias> aliases;

  // One line per layer: "converted encoder.0 (768 -> 3072)" / "skipped head: ...".
  std::string summary() const;
};

Fp8ConversionReport convert_to_fp8(torch::nn::Module& model, const Fp8ConversionOptions& options = {});

}  // namespace torchbridge::amp

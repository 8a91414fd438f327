// convert_to_fp8 (include/torchbridge/amp/fp8_conversion.h).
#include <torchbridge/amp/fp8_conversion.h>
#include <torchbridge/amp/fp8_linear.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstddef>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::amp {
namespace {

std::string qualified(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

constexpr std::size_t kNotAnElement = static_cast<std::size_t>(-1);

// The position of `child` in `sequential`'s element list (which it calls in forward).
std::size_t element_index(const torch::nn::SequentialImpl* sequential, const torch::nn::Module* child) {
  for (std::size_t i = 0; sequential && i < sequential->size(); ++i) {
    if (sequential->ptr(i).get() == child) return i;
  }
  return kNotAnElement;
}

void set_element(torch::nn::SequentialImpl* sequential, std::size_t index, torch::nn::AnyModule element) {
  if (index != kNotAnElement) *(sequential->begin() + static_cast<std::ptrdiff_t>(index)) = std::move(element);
}

// Puts `replacement` where `parent` calls its child `name`, then checks the old layer is gone. If
// anything else still holds it, the swap is undone (the model would keep calling the old layer)
// and false is returned.
bool swap_in(torch::nn::Module& parent, const std::string& name, std::shared_ptr<torch::nn::LinearImpl> linear,
             const Fp8Linear& replacement) {
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&parent);
  const std::size_t position = element_index(sequential, linear.get());
  const std::weak_ptr<torch::nn::LinearImpl> old = linear;
  linear.reset();
  set_element(sequential, position, torch::nn::AnyModule(replacement));
  parent.replace_module(name, replacement.ptr());
  if (old.expired()) return true;

  std::shared_ptr<torch::nn::LinearImpl> still_held = old.lock();
  parent.replace_module(name, still_held);
  set_element(sequential, position, torch::nn::AnyModule(still_held));
  return false;
}

void convert_children(torch::nn::Module& parent, const std::string& prefix, const Fp8ConversionOptions& options,
                      Fp8ConversionReport& report) {
  std::vector<std::string> names;
  for (const auto& item : parent.named_children()) names.push_back(item.key());
  for (const std::string& name : names) {
    std::shared_ptr<torch::nn::Module> child = parent.named_children()[name];
    const std::string full_name = qualified(prefix, name);
    auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(child);
    if (!linear) {
      convert_children(*child, full_name, options, report);
      continue;
    }
    child.reset();
    const int64_t in_features = linear->options.in_features(), out_features = linear->options.out_features();
    if (in_features % 16 != 0 || out_features % 16 != 0) {
      report.skipped.push_back({full_name, "in_features " + std::to_string(in_features) + " and out_features " +
                                               std::to_string(out_features) +
                                               " must both be multiples of 16 for the FP8 matmul"});
      continue;
    }
    if (options.filter && !options.filter(full_name, *linear)) {
      report.skipped.push_back({full_name, "excluded by the filter"});
      continue;
    }
    Fp8Linear replacement(*linear, options.scaling, options.kernel);
    replacement->train(linear->is_training());
    if (swap_in(parent, name, std::move(linear), replacement)) {
      report.converted.push_back({full_name, in_features, out_features});
    } else {
      report.skipped.push_back(
          {full_name,
           "the parent also holds it outside its registry (a member ModuleHolder, a ModuleList, or another "
           "reference), so the model would keep calling the torch::nn::Linear; construct an Fp8Linear there "
           "instead, or keep the layers in a torch::nn::Sequential"});
    }
  }
}

}  // namespace

std::string Fp8ConversionReport::summary() const {
  std::ostringstream text;
  text << "fp8 conversion: " << converted.size() << " Linear layer(s) converted, " << skipped.size() << " skipped\n";
  for (const Converted& layer : converted) {
    text << "  converted " << layer.name << " (" << layer.in_features << " -> " << layer.out_features << ")\n";
  }
  for (const Skipped& layer : skipped) text << "  skipped " << layer.name << ": " << layer.reason << "\n";
  return text.str();
}

Fp8ConversionReport convert_to_fp8(torch::nn::Module& model, const Fp8ConversionOptions& options) {
  options.scaling.validate();
  Fp8ConversionReport report;
  convert_children(model, "", options, report);
  return report;
}

}  // namespace torchbridge::amp

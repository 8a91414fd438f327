// convert_to_fp8 (include/torchbridge/amp/fp8_conversion.h).
#include <torchbridge/amp/fp8_conversion.h>
#include <torchbridge/amp/fp8_linear.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

// Where a Sequential calls `child`: every position of its element list holding it.
struct ElementPositions {
  torch::nn::SequentialImpl* sequential;
  std::vector<std::size_t> positions;
};

void set_elements(const std::vector<ElementPositions>& elements, const torch::nn::AnyModule& element) {
  for (const ElementPositions& held : elements) {
    for (std::size_t i : held.positions) *(held.sequential->begin() + static_cast<std::ptrdiff_t>(i)) = element;
  }
}

// One name a Linear is registered under: `parent`'s child `name`, qualified as `full_name`.
struct Registration {
  torch::nn::Module* parent;
  std::string name;
  std::string full_name;
};

// Every Linear under `parent`, each with all its registrations, in the order first met. A Linear
// registered twice (an alias, or one layer shared by two parents) is one entry: it must become one
// Fp8Linear at every name, or the other names keep calling the old layer.
void find_linears(torch::nn::Module& parent, const std::string& prefix,
                  std::vector<std::pair<const torch::nn::LinearImpl*, std::vector<Registration>>>& found) {
  for (const auto& item : parent.named_children()) {
    const std::string full_name = qualified(prefix, item.key());
    const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(item.value().get());
    if (!linear) {
      find_linears(*item.value(), full_name, found);
      continue;
    }
    auto entry = std::find_if(found.begin(), found.end(), [&](const auto& known) { return known.first == linear; });
    if (entry == found.end()) entry = found.insert(found.end(), {linear, {}});
    const bool known = std::any_of(entry->second.begin(), entry->second.end(), [&](const Registration& r) {
      return r.parent == &parent && r.name == item.key();  // a shared parent met again under another prefix
    });
    if (!known) entry->second.push_back({&parent, item.key(), full_name});
  }
}

// Puts `module` where the parents call it: at each registration, and in the element lists.
void put(const std::vector<Registration>& registrations, const std::vector<ElementPositions>& elements,
         const std::shared_ptr<torch::nn::Module>& module, const torch::nn::AnyModule& element) {
  set_elements(elements, element);
  for (const Registration& r : registrations) r.parent->replace_module(r.name, module);
}

// Puts `replacement` at every name `linear` is registered under, then checks the old layer is
// gone. If anything else still holds it, the swap is undone (the model would keep calling the old
// layer) and false is returned.
bool swap_in(const std::vector<Registration>& registrations, std::shared_ptr<torch::nn::LinearImpl> linear,
             const Fp8Linear& replacement) {
  std::vector<ElementPositions> elements;
  for (const Registration& r : registrations) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(r.parent);
    const bool seen = std::any_of(elements.begin(), elements.end(),
                                  [&](const ElementPositions& held) { return held.sequential == sequential; });
    if (!sequential || seen) continue;
    ElementPositions held{sequential, {}};
    for (std::size_t i = 0; i < sequential->size(); ++i) {
      if (sequential->ptr(i).get() == linear.get()) held.positions.push_back(i);
    }
    elements.push_back(std::move(held));
  }
  const std::weak_ptr<torch::nn::LinearImpl> old = linear;
  linear.reset();
  put(registrations, elements, replacement.ptr(), torch::nn::AnyModule(replacement));
  if (old.expired()) return true;

  std::shared_ptr<torch::nn::LinearImpl> still_held = old.lock();
  put(registrations, elements, still_held, torch::nn::AnyModule(still_held));
  return false;
}

void convert_linears(torch::nn::Module& model, const Fp8ConversionOptions& options, Fp8ConversionReport& report) {
  std::vector<std::pair<const torch::nn::LinearImpl*, std::vector<Registration>>> found;
  find_linears(model, "", found);
  for (const auto& [address, registrations] : found) {
    const Registration& first = registrations.front();
    auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(first.parent->named_children()[first.name]);
    const int64_t in_features = linear->options.in_features(), out_features = linear->options.out_features();
    if (in_features % 16 != 0 || out_features % 16 != 0) {
      report.skipped.push_back({first.full_name, "in_features " + std::to_string(in_features) +
                                                     " and out_features " + std::to_string(out_features) +
                                                     " must both be multiples of 16 for the FP8 matmul"});
      continue;
    }
    if (options.filter && !options.filter(first.full_name, *linear)) {
      report.skipped.push_back({first.full_name, "excluded by the filter"});
      continue;
    }
    Fp8Linear replacement(*linear, options.scaling, options.kernel);
    replacement->train(linear->is_training());
    if (swap_in(registrations, std::move(linear), replacement)) {
      report.converted.push_back({first.full_name, in_features, out_features});
      for (std::size_t i = 1; i < registrations.size(); ++i) {
        report.aliases.push_back({registrations[i].full_name, first.full_name});
      }
    } else {
      report.skipped.push_back(
          {first.full_name,
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
  for (const Alias& layer : aliases) text << "  " << layer.name << " is " << layer.converted_name << ", converted with it\n";
  for (const Skipped& layer : skipped) text << "  skipped " << layer.name << ": " << layer.reason << "\n";
  return text.str();
}

Fp8ConversionReport convert_to_fp8(torch::nn::Module& model, const Fp8ConversionOptions& options) {
  options.scaling.validate();
  Fp8ConversionReport report;
  convert_linears(model, options, report);
  return report;
}

}  // namespace torchbridge::amp

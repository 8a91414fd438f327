// Operators without a native kernel run on the CPU: torch's CPU kernel runs on host replicas of
// the device tensors (host_replicas.h), and results and written arguments land on the device
// exactly as the CPU kernel left them. Each use is counted per operator;
// TORCHBRIDGE_SDK_STRICT=1 turns a fallback into an error. Random operators get the CPU generator
// that carries the SDK device's generator state, so seeding the device seeds what runs.
#include "sdk/registration.h"

#include "sdk/fallback.h"
#include "sdk/generator.h"
#include "sdk/host_replicas.h"
#include "sdk/recursion_guard.h"
#include "sdk/runtime_handle.h"

#include <torchbridge/sdk/device.h>

#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

std::mutex counts_mutex;
// Keyed by the operator's registration (stable for the process) so the hot path formats no
// names; names are only built when counts are read.
std::map<const void*, std::pair<std::string, int64_t>> counts_by_operator;
std::map<std::string, int64_t> counts_by_name;  // paths that are not boxed (convolution)

// The way out, in every strict-mode refusal.
constexpr const char* kStrictWayOut =
    " (unset it to let the operator run on the CPU; fallback_counts(), in Python "
    "torchbridge.devices.fallback_counts(), lists every operator that does)";

bool strict_mode() {
  const char* value = std::getenv(kStrictEnvVar);
  return value != nullptr && std::string(value) == "1";
}

bool is_generator_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (const auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

// Where a call is on the SDK device: `named` when a tensor (alone or in a list) or a device=
// argument puts it there, with that device's index (-1: the current device, for a device= without
// one). A call that reaches the fallback without one got here through its generator alone
// (torch.randn(2, generator=<emu generator>) makes a CPU tensor).
struct SdkPlacement {
  bool named = false;
  c10::DeviceIndex index = -1;
};

SdkPlacement placement_of(const torch::jit::Stack& stack, size_t first, size_t count) {
  const auto on_device = [](const at::Tensor& t) {
    return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
  };
  for (size_t i = first; i < first + count; ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor() && on_device(value.toTensor())) return {true, value.toTensor().device().index()};
    if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return {true, value.toDevice().has_index() ? value.toDevice().index() : c10::DeviceIndex(-1)};
    }
    if (value.isTensorList()) {
      const auto list = value.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        const at::Tensor t = list.get(k);
        if (on_device(t)) return {true, t.device().index()};
      }
    }
  }
  return {};
}

void substitute_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::optional<SdkPlacement> placement;  // found at the first generator argument: most operators take none
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!is_generator_type(arguments[i].type())) continue;
    if (!placement) placement = placement_of(*stack, first, arguments.size());
    c10::IValue& value = (*stack)[first + i];
    if (value.isNone()) {
      value = c10::IValue(cpu_generator_of(default_generator(placement->index)));
    } else if (value.isGenerator()) {
      // As on every torch device: a generator of another device type draws no numbers here (CUDA
      // kernels refuse a CPU generator the same way).
      // And the other way round, as the CPU's kernels refuse a CUDA generator.
      const c10::Device device = value.toGenerator().device();
      TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "Expected a '", runtime().name(),
                  "' device type for generator but found '", device.type(), "' (operator ",
                  c10::toString(op.operator_name()), ")");
      TORCH_CHECK(placement->named, "Expected a 'cpu' device type for generator but found '", runtime().name(),
                  "' (operator ", c10::toString(op.operator_name()), " on CPU tensors)");
      value = c10::IValue(cpu_generator_of(value.toGenerator()));
    }
  }
}

void check_not_strict(const c10::OperatorName& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(!strict_mode(), "operator ", c10::toString(op), " has no native kernel for device '",
                              runtime().name(), "', and ", kStrictEnvVar, "=1 forbids running it on the CPU fallback",
                              kStrictWayOut);
}

// The first two devices among `tensors` that differ, if any, by torch's rule (see fallback.h).
class DeviceAgreement {
 public:
  // False when `t` is on another device than the tensors before it.
  bool admit(const at::Tensor& t) {
    if (!t.defined() || (t.is_cpu() && t.dim() == 0)) return true;
    if (!first_) first_ = t.device();
    if (*first_ == t.device()) return true;
    second_ = t.device();
    return false;
  }
  [[noreturn]] void refuse(std::string_view op) const {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", *first_,
                " and ", *second_, "! (operator ", op, ")");
  }

 private:
  std::optional<c10::Device> first_, second_;
};

// Whether argument `argument` of `op` is the value of an indexed write, which torch takes from any
// device when it is 0-dim: _index_put_impl_ moves a one-element value to self's device.
bool value_from_any_device(const c10::OperatorHandle& op, const c10::Argument& argument) {
  if (argument.name() != "values") return false;
  const std::string& name = op.operator_name().name;
  return name == "aten::index_put_" || name == "aten::index_put" || name == "aten::_index_put_impl_";
}

// The rule for the boxed fallback, on every call: the arguments are read in place on the stack,
// and the operator's name is formatted only for the error.
void check_one_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  const size_t count = arguments.size();
  DeviceAgreement devices;
  const auto refuse = [&] { devices.refuse(c10::toString(op.operator_name())); };
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor()) {
      const at::Tensor& tensor = value.toTensor();
      if (tensor.defined() && tensor.dim() == 0 && value_from_any_device(op, arguments[i - (stack.size() - count)])) {
        continue;
      }
      if (!devices.admit(tensor)) refuse();
    } else if (value.isTensorList()) {
      const auto list = value.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        if (!devices.admit(list.get(k))) refuse();
      }
    }
  }
}

void count_run(const c10::OperatorName& name) {
  std::lock_guard<std::mutex> lock(counts_mutex);
  auto [it, inserted] = counts_by_operator.try_emplace(&name);
  if (inserted) it->second.first = c10::toString(name);
  ++it->second.second;
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  const FallbackDepthGuard depth_guard(name);  // runaway recursion: an error, not a stack overflow
  check_one_device(op, *stack);
  check_not_strict(name);
  count_run(name);
  substitute_generators(op, stack);
  if (run_sparse_on_cpu(op, stack)) return;
  run_on_host(op, stack);
}

}  // namespace

void boxed_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { fallback(op, stack); }

void check_tensors_on_one_device(std::string_view op, c10::ArrayRef<at::Tensor> tensors) {
  DeviceAgreement devices;
  for (const at::Tensor& t : tensors) {
    if (!devices.admit(t)) devices.refuse(op);
  }
}

void note_cpu_fallback(const c10::OperatorHandle& op) {
  check_not_strict(op.operator_name());
  count_run(op.operator_name());
}

void note_cpu_fallback(const std::string& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(!strict_mode(), "operator ", op, " has no native kernel for device '",
                              runtime().name(), "', and ", kStrictEnvVar, "=1 forbids running it on the CPU fallback",
                              kStrictWayOut);
  std::lock_guard<std::mutex> lock(counts_mutex);
  ++counts_by_name[op];
}

void register_cpu_fallback() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
  // These functional operators reach a device without its own kernel through torch's generated
  // composite, which allocates the result at its final shape (0-dim when reduced) and calls the
  // .out kernel; the CPU's .out kernel first resizes it to the unreduced shape, so every call on
  // the device warned "An output with one or more elements was resized", and on the CPU none did.
  // Their CPU functional kernels, through the fallback, behave as on the CPU. (Found by comparing
  // the warnings of every OpInfo sample on emu and on the CPU: these two differed.)
  static auto* functional = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                               __LINE__);
  for (const char* name : {"mse_loss", "smooth_l1_loss"}) {
    functional->impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
  // Composites that reach a device without its own kernel by a path the CPU does not take:
  // conj_physical_ calls its DispatchStub directly, which has no entry for PrivateUse1 (torch's
  // internal assertion "DispatchStub: missing kernel"); addr_ calls addr.out with `self` as the
  // out= argument, which the CPU kernel recognises by the reference's address (lost when a boxed
  // call unboxes it) and the device-generic composite not at all: `t.addr_(u, v)` on a 0-dim `t`
  // made it a matrix where the CPU refuses; kaiser_window (each overload), a factory, calls its
  // DispatchStub directly too. Their CPU kernels, through the fallback, behave as on the CPU.
  for (const char* name : {"conj_physical_", "addr_", "kaiser_window", "kaiser_window.periodic", "kaiser_window.beta"}) {
    functional->impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
  // Normalizations whose device-generic composite (math_native_layer_norm: batch norm, then
  // addcmul) rounds differently from the CPU's fused kernel: a ViT's layer norms were 4.8e-7 off
  // the CPU on emu, where every other layer matched bit for bit.
  for (const char* name : {"native_layer_norm", "native_group_norm"}) {
    functional->impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

std::map<std::string, int64_t> fallback_counts() {
  std::lock_guard<std::mutex> lock(counts_mutex);
  std::map<std::string, int64_t> out = counts_by_name;
  for (const auto& [key, entry] : counts_by_operator) out[entry.first] += entry.second;
  return out;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(counts_mutex);
  counts_by_operator.clear();
  counts_by_name.clear();
}

}  // namespace torchbridge::sdk

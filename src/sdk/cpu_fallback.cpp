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

c10::DeviceIndex device_of_arguments(const torch::jit::Stack& stack, size_t first, size_t count) {
  for (size_t i = first; i < first + count; ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor() && value.toTensor().device().type() == c10::DeviceType::PrivateUse1) {
      return value.toTensor().device().index();
    }
  }
  return -1;  // the current device
}

void substitute_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!is_generator_type(arguments[i].type())) continue;
    c10::IValue& value = (*stack)[first + i];
    if (value.isNone()) {
      value = c10::IValue(cpu_generator_of(default_generator(device_of_arguments(*stack, first, arguments.size()))));
    } else if (value.isGenerator() && value.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
      value = c10::IValue(cpu_generator_of(value.toGenerator()));
    }
  }
}

void check_not_strict(const c10::OperatorName& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(!strict_mode(), "operator ", c10::toString(op), " has no native kernel for device '",
                              runtime().name(), "', and ", kStrictEnvVar, "=1 forbids running it on the CPU fallback",
                              kStrictWayOut);
}

// Like every torch device: an operator's tensors must live on one device; 0-dim CPU tensors count
// as scalars. Without this check the fallback would quietly compute across devices.
void check_one_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t count = op.schema().arguments().size();
  std::optional<c10::Device> seen;
  const auto visit = [&](const at::Tensor& t) {
    if (!t.defined() || (t.is_cpu() && t.dim() == 0)) return;
    if (!seen) seen = t.device();
    TORCH_CHECK(*seen == t.device(), "Expected all tensors to be on the same device, but found at least two devices, ",
                *seen, " and ", t.device(), "! (operator ", c10::toString(op.operator_name()), ")");
  };
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor()) visit(value.toTensor());
    else if (value.isTensorList()) for (const at::Tensor& t : value.toTensorList().vec()) visit(t);
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

#include "sdk/in_place_fallback.h"

#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace torchbridge::sdk {
namespace {

std::vector<bool> addressable;

bool on_sdk_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

at::Tensor host_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

bool is_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// Host code may only touch device memory once the device's queued work on it is done.
void wait_for_device(c10::DeviceIndex device) {
  const tb_stream stream = native_stream(current_stream(device));
  if (runtime().table().stream_query(runtime().context(), stream) != TB_SUCCESS) {
    TB_CALL(stream_synchronize, stream);
  }
}

// A result of the CPU kernel as a device tensor. A result that views an input's host alias is
// the same view of the input's device tensor; anything else is new memory and is copied over.
at::Tensor to_device(const at::Tensor& result, const std::vector<at::Tensor>& originals, const c10::Device& target) {
  const void* storage = result.storage().data();
  for (const auto& original : originals) {
    if (!original.defined() || storage != original.data_ptr()) continue;
    if (result.dtype() == original.dtype()) {
      return original.as_strided(result.sizes(), result.strides(), original.storage_offset() + result.storage_offset());
    }
    return result.clone().to(target);  // a reinterpreting view: a copy keeps the values right
  }
  return result.to(target);
}

}  // namespace

void init_host_addressable(int device_count) {
  for (int d = 0; d < device_count; ++d) addressable.push_back(runtime().properties(d).host_addressable != 0);
}

bool host_addressable(c10::DeviceIndex index) {
  return index >= 0 && static_cast<size_t>(index) < addressable.size() && addressable[index];
}

bool run_in_place(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  c10::DeviceIndex device = -1;
  // Only plain tensor arguments are handled; lists, and devices that are not host-addressable,
  // take the copying path.
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensorList() || value.isOptionalTensorList() || value.isList()) return false;
    if (!value.isTensor() || !on_sdk_device(value.toTensor())) continue;
    const c10::DeviceIndex index = value.toTensor().device().index();
    if (!host_addressable(index) || (device >= 0 && device != index)) return false;
    device = index;
  }
  if (device < 0) return false;
  wait_for_device(device);

  std::vector<at::Tensor> originals(arguments.size());
  std::vector<at::Tensor> grown_outputs(arguments.size());  // empty out= tensors the kernel sizes
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (!value.isTensor() || !on_sdk_device(value.toTensor())) continue;
    originals[i] = value.toTensor();
    if (is_written(arguments[i]) && arguments[i].name() != "self") {
      // An out= tensor may be resized by the kernel, which a host alias cannot be: the kernel
      // writes a host tensor of the same layout, copied back below.
      grown_outputs[i] = at::empty_strided(originals[i].sizes(), originals[i].strides(),
                                           originals[i].options().device(c10::kCPU));
      value = c10::IValue(grown_outputs[i]);
    } else {
      value = c10::IValue(host_alias(originals[i]));
    }
  }

  op.callBoxed(stack);

  for (size_t i = 0; i < arguments.size(); ++i) {
    const at::Tensor& grown = grown_outputs[i];
    if (!grown.defined()) continue;
    if (grown.sizes() != originals[i].sizes()) originals[i].resize_(grown.sizes());
    if (grown.is_contiguous() && originals[i].is_contiguous() && grown.dtype() == originals[i].dtype()) {
      std::memcpy(originals[i].data_ptr(), grown.data_ptr(), grown.nbytes());  // host-addressable
    } else {
      originals[i].copy_(grown);
    }
  }
  const auto& returns = op.schema().returns();
  const size_t first_return = stack->size() - returns.size();
  const c10::Device target(c10::DeviceType::PrivateUse1, device);
  for (size_t r = 0; r < returns.size(); ++r) {
    c10::IValue& value = (*stack)[first_return + r];
    // A returned mutated argument (in-place or out=) is the caller's own device tensor.
    bool replaced = false;
    if (is_written(returns[r])) {
      for (size_t i = 0; i < arguments.size(); ++i) {
        if (originals[i].defined() && is_written(arguments[i]) &&
            arguments[i].alias_info()->beforeSets() == returns[r].alias_info()->beforeSets()) {
          value = c10::IValue(originals[i]);
          replaced = true;
          break;
        }
      }
    }
    if (replaced) continue;
    if (value.isTensor() && value.toTensor().defined()) {
      value = c10::IValue(to_device(value.toTensor(), originals, target));
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) list[k] = to_device(list.get(k), originals, target);
      value = c10::IValue(list);
    }
  }
  return true;
}

}  // namespace torchbridge::sdk

#include "sdk/host_replicas.h"

#include "sdk/copy.h"
#include "sdk/hooks.h"
#include "sdk/in_place_fallback.h"
#include "sdk/runtime_handle.h"
#include "sdk/tensor_views.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_copy_from_and_resize.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

constexpr size_t kNoReplica = static_cast<size_t>(-1);

bool on_sdk_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

bool is_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// Only plain strided tensors have a storage to replicate; anything else is copied as a value.
bool replicable(const at::Tensor& t) { return t.layout() == c10::kStrided && t.has_storage(); }

// A device tensor among the arguments: argument `argument`, element `element` of a list (-1: not
// a list), and the CPU tensor the kernel gets in its place.
struct Slot {
  Slot(size_t argument, int64_t element, at::Tensor device, const c10::Argument& schema)
      : argument(argument), element(element), device(std::move(device)), written(is_written(schema)),
        out(schema.is_out()) {}
  size_t argument;
  int64_t element;
  at::Tensor device;
  bool written;
  bool out;  // an out= argument: the kernel overwrites it and never reads it
  size_t replica = kNoReplica;  // kNoReplica: `host` is an independent copy of the value
  at::Tensor host;
};

// One device storage as the kernel sees it. `host` byte 0 is device storage byte `begin`.
struct Replica {
  explicit Replica(c10::Storage device) : device(std::move(device)) {}
  c10::Storage device;
  c10::Storage host;
  size_t begin = 0;
  size_t copied = 0;    // bytes copied in from the device (copy replicas)
  bool alias = false;   // `host` is the device memory itself (host-addressable devices)
  bool downloaded = true;  // false: `host` starts uninitialised (a lone out= argument)
  bool written = false;
};

size_t byte_offset(const at::Tensor& t) { return static_cast<size_t>(t.storage_offset()) * t.element_size(); }

// One past the last byte `t` touches, counted from its storage's start (its offset when empty).
size_t end_byte(const at::Tensor& t) {
  if (t.numel() == 0) return byte_offset(t);
  return at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size(), t.storage_offset());
}

// The same view as `like` (dtype, sizes, strides, conjugate/negative bits) of another storage.
at::Tensor same_view(const at::Tensor& like, const c10::Storage& storage, c10::DispatchKey key, int64_t offset) {
  at::Tensor t = view_of(storage, key, like.dtype(), offset, like.sizes(), like.strides());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

at::Tensor byte_range(const c10::Storage& storage, c10::DispatchKey key, size_t begin, size_t length) {
  const auto n = static_cast<int64_t>(length);
  return view_of(storage, key, caffe2::TypeMeta::Make<uint8_t>(), static_cast<int64_t>(begin), {n}, {1});
}

// Device memory as a CPU storage of the same size. Resizable with the CPU allocator, so a kernel
// that grows an argument gets fresh host memory (holding the old bytes), detected afterwards.
c10::Storage alias_of(const c10::Storage& device) {
  void* data = device.mutable_data();
  return c10::Storage(c10::Storage::use_byte_size_t(), device.nbytes(), c10::DataPtr(data, c10::Device(c10::kCPU)),
                      c10::GetCPUAllocator(), /*resizable=*/true);
}

std::vector<Slot> collect_slots(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  std::vector<Slot> slots;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::IValue& value = stack[first + i];
    const c10::Argument& argument = schema.arguments()[i];
    if (value.isTensor()) {
      if (on_sdk_device(value.toTensor())) slots.emplace_back(i, -1, value.toTensor(), argument);
    } else if (value.isTensorList()) {
      const auto list = value.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        const at::Tensor t = list.get(k);
        if (on_sdk_device(t)) slots.emplace_back(i, static_cast<int64_t>(k), t, argument);
      }
    } else if (value.isOptionalTensorList()) {
      const auto list = value.toOptionalTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        const std::optional<at::Tensor> t = list.get(k);
        if (t.has_value() && on_sdk_device(*t)) slots.emplace_back(i, static_cast<int64_t>(k), *t, argument);
      }
    }
  }
  return slots;
}

// Groups the slots by device storage. Copying devices replicate only storages holding a written
// argument (read-only values are copied as values); host-addressable devices alias every storage.
std::vector<Replica> plan_replicas(std::vector<Slot>& slots, bool alias) {
  std::set<const c10::StorageImpl*> written;
  for (const Slot& s : slots) {
    if (s.written && replicable(s.device)) written.insert(s.device.storage().unsafeGetStorageImpl());
  }
  std::vector<Replica> replicas;
  std::map<const c10::StorageImpl*, size_t> index;
  for (Slot& s : slots) {
    if (!replicable(s.device)) continue;
    const c10::StorageImpl* impl = s.device.storage().unsafeGetStorageImpl();
    if (!alias && written.count(impl) == 0) continue;
    const auto [it, inserted] = index.try_emplace(impl, replicas.size());
    if (inserted) replicas.emplace_back(s.device.storage());
    s.replica = it->second;
    replicas[s.replica].written |= s.written;
  }
  return replicas;
}

void fill_replica(Replica& replica, const std::vector<Slot>& slots, size_t index, bool alias) {
  if (alias) {
    replica.alias = true;
    replica.host = alias_of(replica.device);
    return;
  }
  // The byte range the arguments touch, starting at a multiple of every element size so each
  // argument's offset stays whole in its own elements.
  size_t begin = SIZE_MAX, end = 0, align = 1, members = 0;
  const Slot* member = nullptr;
  for (const Slot& s : slots) {
    if (s.replica != index) continue;
    begin = std::min(begin, byte_offset(s.device));
    end = std::max(end, end_byte(s.device));
    align = std::lcm(align, s.device.element_size());
    member = &s;
    ++members;
  }
  begin -= begin % align;
  end = std::min(end, replica.device.nbytes());
  replica.begin = begin;
  replica.copied = end > begin ? end - begin : 0;
  // A lone dense out= argument is overwritten whole and never read: its old bytes need not cross.
  if (members == 1 && member->out && member->device.is_non_overlapping_and_dense()) {
    replica.host = at::empty({static_cast<int64_t>(replica.copied)}, at::TensorOptions().dtype(at::kByte)).storage();
    replica.downloaded = false;
    return;
  }
  replica.host = download(byte_range(replica.device, c10::DispatchKey::PrivateUse1, begin, replica.copied)).storage();
}

// After the kernel: written arguments whose metadata the kernel changed (a resize) get it on the
// device too, and every written replica's bytes reach device memory.
void write_back(Replica& replica, std::vector<Slot>& slots, size_t index) {
  std::vector<Slot*> changed;
  size_t needed = replica.device.nbytes();
  for (Slot& s : slots) {
    if (s.replica != index || !s.written) continue;
    const int64_t offset = s.host.storage_offset() + static_cast<int64_t>(replica.begin / s.host.element_size());
    if (s.host.sizes() != s.device.sizes() || s.host.strides() != s.device.strides() ||
        offset != s.device.storage_offset()) {
      changed.push_back(&s);
      needed = std::max(needed, replica.begin + end_byte(s.host));
    }
  }
  // The CPU allocator moved an alias that a kernel grew: the host copy now holds every byte.
  const bool moved = replica.alias && replica.host.data() != replica.device.data();
  if (moved) needed = std::max(needed, replica.host.nbytes());
  if (needed > replica.device.nbytes()) resize_storage_bytes(replica.device, needed);
  for (Slot* s : changed) {
    const int64_t offset = s->host.storage_offset() + static_cast<int64_t>(replica.begin / s->host.element_size());
    s->device.unsafeGetTensorImpl()->set_sizes_and_strides(s->host.sizes(), s->host.strides(), offset);
  }
  if (replica.alias) {
    if (moved && replica.host.nbytes() > 0) {
      std::memcpy(replica.device.mutable_data(), replica.host.data(), replica.host.nbytes());
    }
    return;
  }
  if (!replica.downloaded) {  // only what the kernel wrote: the out= argument's elements (resized or not)
    for (Slot& s : slots) {
      if (s.replica == index) s.device.copy_(s.host);
    }
    return;
  }
  // Only the written arguments' elements go back: the other bytes of the range (arguments only
  // read, holes between elements) may be written meanwhile by another thread or stream, and
  // writing back what was read before the kernel ran undid those writes.
  for (Slot& s : slots) {
    if (s.replica != index || !s.written) continue;
    if (std::find(changed.begin(), changed.end(), &s) != changed.end()) {
      s.device.copy_(s.host);  // resized: may reach past the bytes copied in
    } else {
      upload(s.host, s.device);
    }
  }
}

// A kernel may leave a written argument as a conjugate or negative view of what it computed
// (linalg_lu_solve with left=False does): its bytes then mean something else than the device
// tensor's bits say. The value is resolved on the host and copied in, honouring the device
// tensor's own bits.
void resolve_math_bits(const std::vector<Slot>& slots) {
  for (const Slot& s : slots) {
    if (!s.written || s.replica == kNoReplica) continue;
    if (s.host.is_conj() == s.device.is_conj() && s.host.is_neg() == s.device.is_neg()) continue;
    const at::Tensor value = s.host.resolve_conj().resolve_neg().clone();  // never aliases the device
    s.device.copy_(value);
  }
}

// A result of the CPU kernel as a device tensor: a view of an aliased device storage stays that
// view; anything else is new memory and is copied over.
at::Tensor to_device(const at::Tensor& result, const std::vector<Replica>& replicas, const c10::Device& target) {
  if (!result.defined() || result.device().type() != c10::kCPU) return result;
  if (replicable(result)) {
    const c10::StorageImpl* impl = result.storage().unsafeGetStorageImpl();
    for (const Replica& replica : replicas) {
      if (replica.alias && replica.host.unsafeGetStorageImpl() == impl) {
        return same_view(result, replica.device, c10::DispatchKey::PrivateUse1, result.storage_offset());
      }
    }
  }
  return result.to(target);
}

}  // namespace

void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  // torch implements some operators for particular accelerators only (CUDA's fused kernels, stream
  // bookkeeping): there is no CPU kernel to fall back to, and the dispatcher's own message would
  // blame the CPU. Say what is missing and what the user can do instead.
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), "operator ",
                              schema.operator_name(), " has no kernel for device '", runtime().name(),
                              "', and PyTorch has no CPU kernel for the CPU fallback to run (it implements it only ",
                              "for particular accelerators such as CUDA). Run this step on the CPU (move its tensors ",
                              "there with .cpu()), or give the device a kernel for it");
  const size_t first = stack->size() - schema.arguments().size();
  const std::vector<c10::IValue> originals(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());

  std::vector<Slot> slots = collect_slots(schema, *stack, first);
  std::optional<c10::Device> target;
  for (size_t i = 0; i < originals.size(); ++i) {  // a factory's device= argument names the target
    if (originals[i].isDevice() && originals[i].toDevice().type() == c10::DeviceType::PrivateUse1) {
      if (!target) target = originals[i].toDevice();
      (*stack)[first + i] = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  if (!target && !slots.empty()) target = slots.front().device.device();
  const bool alias = !slots.empty() && host_addressable(slots.front().device.device().index());

  std::vector<Replica> replicas = plan_replicas(slots, alias);
  std::vector<bool> filled(replicas.size(), false);
  // One host tensor per device tensor: a kernel tells an in-place call (`mul_out(self, self, b)`,
  // which every `op_` composite becomes) from an out= call by the tensors' identity, and refuses
  // to broadcast into its own input only when it sees the same tensor twice. With two views it
  // would resize `self` as an out= argument, which torch's own CPU call refuses.
  std::map<const c10::TensorImpl*, at::Tensor> host_of;
  for (Slot& s : slots) {  // in argument order, so copies leave the device in that order
    const auto [seen, first_use] = host_of.try_emplace(s.device.unsafeGetTensorImpl());
    if (!first_use) {
      s.host = seen->second;
      continue;
    }
    if (s.replica == kNoReplica) {
      s.host = s.device.cpu();
      seen->second = s.host;
      continue;
    }
    if (!filled[s.replica]) fill_replica(replicas[s.replica], slots, s.replica, alias);
    filled[s.replica] = true;
    const Replica& replica = replicas[s.replica];
    s.host = same_view(s.device, replica.host, c10::DispatchKey::CPU,
                       static_cast<int64_t>((byte_offset(s.device) - replica.begin) / s.device.element_size()));
    seen->second = s.host;
  }

  // The kernel's arguments: host tensors in place of device tensors; lists are rebuilt, never
  // modified, since the caller's list objects are shared.
  std::map<size_t, c10::IValue> lists;
  for (const Slot& s : slots) {
    c10::IValue& value = (*stack)[first + s.argument];
    if (s.element < 0) {
      value = c10::IValue(s.host);
      continue;
    }
    auto [it, inserted] = lists.try_emplace(s.argument);
    if (inserted) {
      it->second = value.isTensorList() ? c10::IValue(value.toTensorList().copy())
                                        : c10::IValue(value.toOptionalTensorList().copy());
    }
    if (it->second.isTensorList()) {
      it->second.toTensorList().set(static_cast<size_t>(s.element), s.host);
    } else {
      it->second.toOptionalTensorList().set(static_cast<size_t>(s.element), std::optional<at::Tensor>(s.host));
    }
  }
  for (auto& [argument, list] : lists) (*stack)[first + argument] = list;

  if (alias) wait_for_device(slots.front().device.device().index());
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (size_t r = 0; r < replicas.size(); ++r) {
    if (replicas[r].written) write_back(replicas[r], slots, r);
  }
  resolve_math_bits(slots);
  for (const Slot& s : slots) {
    if (s.written && s.replica == kNoReplica) at::_copy_from_and_resize(s.host, s.device);
  }

  const auto& returns = schema.returns();
  const size_t first_return = stack->size() - returns.size();
  for (size_t r = 0; r < returns.size(); ++r) {
    c10::IValue& value = (*stack)[first_return + r];
    if (is_written(returns[r])) {  // an in-place or out= result is the caller's own argument
      bool found = false;
      for (size_t i = 0; i < schema.arguments().size() && !found; ++i) {
        const c10::AliasInfo* info = schema.arguments()[i].alias_info();
        if (is_written(schema.arguments()[i]) && *info == *returns[r].alias_info()) {
          value = originals[i];
          found = true;
        }
      }
      TORCH_CHECK(found, "operator ", schema.operator_name(), " returns a written alias that is none of its arguments");
      continue;
    }
    if (!target) continue;
    if (value.isTensor()) {
      value = c10::IValue(to_device(value.toTensor(), replicas, *target));
    } else if (value.isTensorList()) {
      const auto list = value.toTensorList();
      c10::List<at::Tensor> moved;
      moved.reserve(list.size());
      for (size_t k = 0; k < list.size(); ++k) moved.push_back(to_device(list.get(k), replicas, *target));
      value = c10::IValue(moved);
    }
  }
}

}  // namespace torchbridge::sdk

// Every copy goes through the current stream of the device involved, so it is ordered after the
// work already queued there. Copies with identical layouts move raw bytes; anything else (a dtype
// change, different strides, a view with holes) is staged on the CPU, where torch's own copy
// kernels do the conversion, and only whole storage spans cross the bus.
//
// Math bits: a tensor with the conjugate or negative bit set holds plain bytes whose values are
// read conjugated or negated. PyTorch's Conjugate/Negative fallback would resolve such a tensor
// by clone(), whose copy_ calls _copy_from with the bit still set: unbounded recursion. So
// _copy_from passes through those keys (register_copy_math_bits) and resolves the bits here, on
// the host side of the copy, as CUDA's copy kernel does on the GPU.
#include "sdk/copy.h"
#include "sdk/registration.h"

#include "sdk/caching_allocator.h"
#include "sdk/host_allocator.h"
#include "sdk/recursion_guard.h"
#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/Event.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>
#include <cstdint>
#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

bool on_sdk_device(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// Bytes from a tensor's first to its last element (torch strides are never negative).
size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<size_t>(last + 1) * t.element_size();
}

// Calls `visit(offset, bytes)` for each run of contiguous bytes that `t`'s elements occupy, the
// offset counted from its first element: its innermost dimensions that are contiguous make one run,
// and every index of the others starts one.
template <typename Visit>
void for_each_contiguous_run(const at::Tensor& t, const Visit& visit) {
  std::vector<int64_t> sizes, strides;  // dimensions of size 1 move nothing
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    sizes.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  int64_t run = 1;
  while (!sizes.empty() && strides.back() == run) {
    run *= sizes.back();
    sizes.pop_back();
    strides.pop_back();
  }
  const auto element = static_cast<size_t>(t.element_size());
  std::vector<int64_t> index(sizes.size(), 0);
  while (true) {
    int64_t offset = 0;
    for (size_t d = 0; d < sizes.size(); ++d) offset += index[d] * strides[d];
    visit(static_cast<size_t>(offset) * element, static_cast<size_t>(run) * element);
    size_t d = sizes.size();
    while (d > 0 && ++index[d - 1] == sizes[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

// Raw bytes can move only when both sides lay out and read their bytes the same way.
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.is_non_overlapping_and_dense() && a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

// Host tensor `host` (plain bytes) read the way `like` reads its bytes: CPU copy_ then applies the
// conjugation/negation while it converts, on either side of the copy.
at::Tensor with_math_bits_of(at::Tensor host, const at::Tensor& like) {
  host._set_conj(like.is_conj());
  host._set_neg(like.is_neg());
  return host;
}

// A blocking copy ordered on `stream`. When the stream has nothing queued, the copy runs on the
// calling thread (memcpy_sync), skipping a round trip through the stream: same ordering, less
// latency. Otherwise it is queued behind the stream's work and waited for.
void blocking_copy(void* dst, const void* src, size_t bytes, tb_memcpy_kind kind, const c10::Stream& stream) {
  const tb_stream handle = native_stream(stream);
  if (runtime().table().stream_query(runtime().context(), handle) == TB_SUCCESS) {
    TB_CALL(memcpy_sync, dst, src, bytes, kind);
    return;
  }
  TB_CALL(memcpy_async, dst, src, bytes, kind, handle);
  TB_CALL(stream_synchronize, handle);
}

// A copy between the host and a device, ordered on `stream`. A non_blocking copy from or to
// pinned memory is only queued, its pinned block kept alive until the stream has run it; any
// other copy is blocking, as with CUDA's pageable memory.
void host_device_copy(void* dst, const void* src, size_t bytes, tb_memcpy_kind kind, const c10::Stream& stream,
                      const void* host_pointer, bool non_blocking) {
  if (!non_blocking || !host_allocator().is_pinned(host_pointer)) {
    blocking_copy(dst, src, bytes, kind, stream);
    return;
  }
  TB_CALL(memcpy_async, dst, src, bytes, kind, native_stream(stream));
  host_allocator().record_use(host_pointer, stream);
}

void raw_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const size_t bytes = span_bytes(src);
  if (bytes == 0) return;
  if (!on_sdk_device(src)) {
    host_device_copy(dst.data_ptr(), src.data_ptr(), bytes, TB_MEMCPY_HOST_TO_DEVICE,
                     current_stream(dst.device().index()), src.data_ptr(), non_blocking);
  } else if (!on_sdk_device(dst)) {
    host_device_copy(dst.data_ptr(), src.data_ptr(), bytes, TB_MEMCPY_DEVICE_TO_HOST,
                     current_stream(src.device().index()), dst.data_ptr(), non_blocking);
  } else {  // device -> device, asynchronous to the host
    // Between two streams (two devices), a barrier both ways, as CUDA's copy between devices: the
    // copy runs on the source's stream after the destination's queued work, and the destination's
    // stream waits for it. Ordered one way only (on the destination's stream, after the source's
    // work), a later write to the source on its own stream could land before the copy read it.
    const c10::Stream dst_stream = current_stream(dst.device().index());
    const c10::Stream src_stream = current_stream(src.device().index());
    if (src_stream != dst_stream) {
      c10::Event destination_ready(c10::DeviceType::PrivateUse1);
      destination_ready.record(dst_stream);
      destination_ready.block(src_stream);
    }
    TB_CALL(memcpy_async, dst.data_ptr(), src.data_ptr(), bytes, TB_MEMCPY_DEVICE_TO_DEVICE,
            native_stream(src_stream));
    if (src_stream != dst_stream) {
      c10::Event copied(c10::DeviceType::PrivateUse1);
      copied.record(src_stream);
      copied.block(dst_stream);
    }
  }
}

}  // namespace

at::Tensor download(const at::Tensor& t) {
  const size_t bytes = span_bytes(t);
  const int64_t elements = static_cast<int64_t>(bytes / std::max<size_t>(t.element_size(), 1));
  at::Tensor staging = at::empty({elements}, t.options().device(c10::kCPU));
  if (bytes > 0) {
    blocking_copy(staging.data_ptr(), t.data_ptr(), bytes, TB_MEMCPY_DEVICE_TO_HOST, current_stream(t.device().index()));
  }
  return staging.as_strided(t.sizes(), t.strides(), 0);
}

at::Tensor staging_for(const at::Tensor& dst) {
  // A dense destination is overwritten entirely; a view with holes is read first so the bytes
  // between its elements survive the write-back.
  return dst.is_non_overlapping_and_dense()
             ? at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(c10::kCPU))
             : download(dst);
}

void upload(const at::Tensor& staging, const at::Tensor& dst) {
  const size_t bytes = span_bytes(dst);
  if (bytes == 0) return;
  if (dst.is_non_overlapping_and_dense()) {
    blocking_copy(dst.data_ptr(), staging.data_ptr(), bytes, TB_MEMCPY_HOST_TO_DEVICE,
                  current_stream(dst.device().index()));
    return;
  }
  // A view with holes: only its elements' bytes go back. The holes may belong to tensors another
  // thread or stream writes meanwhile; writing the whole span back, as read before the kernel ran,
  // undid those writes (x[:, 0] += 1 beside a thread updating x[:, 1] lost 3999 of its 4000 updates).
  wait_for_device(dst.device().index());
  auto* device_bytes = static_cast<char*>(dst.data_ptr());
  const auto* host_bytes = static_cast<const char*>(staging.data_ptr());
  for_each_contiguous_run(dst, [&](size_t offset, size_t length) {
    TB_CALL(memcpy_sync, device_bytes + offset, host_bytes + offset, length, TB_MEMCPY_HOST_TO_DEVICE);
  });
}

void wait_for_device(c10::DeviceIndex device) {
  const tb_stream stream = native_stream(current_stream(device));
  if (runtime().table().stream_query(runtime().context(), stream) != TB_SUCCESS) {
    TB_CALL(stream_synchronize, stream);
  }
}

void copy_bytes_after_wait(void* dst, const void* src, size_t bytes, tb_memcpy_kind kind) {
  if (bytes > 0) TB_CALL(memcpy_sync, dst, src, bytes, kind);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_stack_headroom("aten::_copy_from");
  // copy_ broadcasts its source to the destination's shape, as on every torch device, and refuses
  // what does not broadcast with the CPU's own messages, an empty destination included.
  const auto broadcast = at::infer_size_dimvector(dst.sizes(), self.sizes());
  TORCH_CHECK(c10::IntArrayRef(broadcast) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(broadcast));
  if (dst.numel() == 0) return dst;
  // torch's copy_ hands devices it does not know to _copy_from before its own overlap checks, so
  // they are made here, as every torch device makes them: a destination that overlaps itself or
  // part of its source has no single right result (x[2:8].copy_(x[0:6]) is refused on the CPU).
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, self);
  const at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand(dst.sizes());
  if (same_layout(src, dst)) {
    raw_copy(src, dst, non_blocking);
    return dst;
  }
  const at::Tensor source = on_sdk_device(src) ? with_math_bits_of(download(src), src) : src;
  if (!on_sdk_device(dst)) {
    dst.copy_(source);
    return dst;
  }
  at::Tensor staging = staging_for(dst);
  with_math_bits_of(staging, dst).copy_(source);  // the bytes dst must hold, math bits included
  upload(staging, dst);
  return dst;
}

void register_copy_math_bits() {
  for (const auto key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
    auto* library = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    library->impl("_copy_from", torch::CppFunction::makeFallthrough());
    library->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }
}

}  // namespace torchbridge::sdk

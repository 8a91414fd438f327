#include "checkpoint/distinct_tensors.h"

#include <c10/util/Exception.h>

#include <cstdint>

namespace torchbridge::checkpoint {

void DistinctTensors::add(const std::string& name, const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(names_.insert(name).second, where_, ": tensor name '", name, "' is given twice");
  if (!tensor.defined() || !tensor.has_storage() || tensor.numel() == 0) return;
  // torch's strides are non-negative, so the last element lies at the sum of (size - 1) * stride.
  int64_t last = tensor.storage_offset();
  for (int64_t d = 0; d < tensor.dim(); ++d) last += (tensor.size(d) - 1) * tensor.stride(d);
  const auto item = static_cast<size_t>(tensor.element_size());
  const Span span{static_cast<size_t>(tensor.storage_offset()) * item, static_cast<size_t>(last + 1) * item, name};
  auto& spans = spans_[tensor.storage().unsafeGetStorageImpl()];
  for (const Span& other : spans) {
    TORCH_CHECK_VALUE(span.end <= other.begin || other.end <= span.begin, where_, ": tensors '", other.name,
                      "' and '", name, "' share storage; safetensors stores tensors separately, so save a clone of "
                      "one (e.g. for tied weights) or only one of them");
  }
  spans.push_back(span);
}

}  // namespace torchbridge::checkpoint

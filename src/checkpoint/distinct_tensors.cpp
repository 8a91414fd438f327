#include "checkpoint/distinct_tensors.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <iterator>

namespace torchbridge::checkpoint {

void DistinctTensors::add(const std::string& name, const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(names_.insert(name).second, where_, ": tensor name '", name, "' is given twice");
  if (!tensor.defined() || !tensor.has_storage() || tensor.numel() == 0) return;
  // torch's strides are non-negative, so the last element lies at the sum of (size - 1) * stride.
  int64_t last = tensor.storage_offset();
  for (int64_t d = 0; d < tensor.dim(); ++d) last += (tensor.size(d) - 1) * tensor.stride(d);
  const auto item = static_cast<size_t>(tensor.element_size());
  const size_t begin = static_cast<size_t>(tensor.storage_offset()) * item;
  const size_t end = static_cast<size_t>(last + 1) * item;
  auto& spans = spans_[tensor.storage().unsafeGetStorageImpl()];
  const auto refuse = [&](const Span& other) {
    TORCH_CHECK_VALUE(false, where_, ": tensors '", other.name, "' and '", name, "' share storage; safetensors "
                      "stores tensors separately, so save a clone of one (e.g. for tied weights) or only one of them");
  };
  const auto next = spans.lower_bound(begin);  // the first span beginning at or after this one
  if (next != spans.end() && next->first < end) refuse(next->second);
  if (next != spans.begin() && std::prev(next)->second.end > begin) refuse(std::prev(next)->second);
  spans.emplace(begin, Span{end, name});
}

}  // namespace torchbridge::checkpoint

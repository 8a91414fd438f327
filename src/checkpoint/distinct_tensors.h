#pragma once
// What a safetensors file, or a sharded checkpoint as a whole, may not hold twice: a name, or the
// same bytes of a storage (the format stores every tensor on its own, so two tensors sharing bytes,
// e.g. tied weights, would come back apart). Views of one storage whose byte spans do not overlap
// (the row blocks of a fused weight) are distinct, as the safetensors package has them.

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <map>
#include <set>
#include <string>
#include <utility>

namespace torchbridge::checkpoint {

class DistinctTensors {
 public:
  // `where` (a file or directory path) starts every error message.
  explicit DistinctTensors(std::string where) : where_(std::move(where)) {}

  // Raises ValueError naming the name given twice, or both tensors whose bytes overlap. Shared
  // bytes are refused rather than silently duplicated or dropped: the caller decides.
  void add(const std::string& name, const at::Tensor& tensor);

 private:
  // The bytes [begin, end) of a storage a tensor spans (all between its first and last element),
  // by begin: the spans of one storage never overlap, so a new one need only be checked against
  // its neighbours.
  struct Span {
    size_t end;
    std::string name;
  };
  std::string where_;
  std::set<std::string> names_;
  std::map<const c10::StorageImpl*, std::map<size_t, Span>> spans_;
};

}  // namespace torchbridge::checkpoint

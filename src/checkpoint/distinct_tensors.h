#pragma once
// What a safetensors file, or a sharded checkpoint as a whole, may not hold twice: a name, or a
// storage (the format stores every tensor on its own, so two sharing one would come back apart).

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

  // Raises ValueError naming the name given twice, or both tensors that share storage. Shared
  // storage is refused rather than silently duplicated or dropped: the caller decides.
  void add(const std::string& name, const at::Tensor& tensor);

 private:
  std::string where_;
  std::set<std::string> names_;
  std::map<const c10::StorageImpl*, std::string> owners_;
};

}  // namespace torchbridge::checkpoint

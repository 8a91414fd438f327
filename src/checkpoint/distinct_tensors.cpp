#include "checkpoint/distinct_tensors.h"

#include <c10/util/Exception.h>

namespace torchbridge::checkpoint {

void DistinctTensors::add(const std::string& name, const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(names_.insert(name).second, where_, ": tensor name '", name, "' is given twice");
  if (!tensor.defined() || !tensor.has_storage() || tensor.storage().nbytes() == 0) return;
  const auto [owner, fresh] = owners_.emplace(tensor.storage().unsafeGetStorageImpl(), name);
  TORCH_CHECK_VALUE(fresh, where_, ": tensors '", owner->second, "' and '", name,
                    "' share storage; safetensors stores tensors separately, so save a clone of one "
                    "(e.g. for tied weights) or only one of them");
}

}  // namespace torchbridge::checkpoint

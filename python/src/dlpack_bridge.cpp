#include "dlpack_bridge.h"

#include <ATen/DLConvertor.h>
#include <c10/util/Exception.h>

namespace py = pybind11;

namespace torchbridge::python {

py::capsule to_capsule(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.is_cpu(), "only CPU tensors cross as DLPack capsules here, got ", tensor.device());
  DLManagedTensor* managed = at::toDLPack(tensor);
  // Per the protocol, a consumer renames the capsule to "used_dltensor"; an unconsumed capsule
  // still owns the tensor and must release it.
  return py::capsule(managed, "dltensor", [](PyObject* object) {
    if (PyCapsule_IsValid(object, "dltensor")) {
      auto* unused = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(object, "dltensor"));
      if (unused != nullptr && unused->deleter != nullptr) unused->deleter(unused);
    }
  });
}

at::Tensor from_capsule(const py::capsule& capsule) {
  TORCH_CHECK_VALUE(PyCapsule_IsValid(capsule.ptr(), "dltensor"),
                    "expected an unconsumed DLPack capsule (torch.utils.dlpack.to_dlpack(tensor))");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  return at::fromDLPack(managed);
}

}  // namespace torchbridge::python

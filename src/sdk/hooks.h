#pragma once
#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace torchbridge::sdk {
// PyTorch's PrivateUse1 hooks for the registered SDK device.
at::PrivateUse1HooksInterface* make_hooks();
// Grows `storage` to `new_bytes`, keeping its contents (used by resize_ and the hooks).
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);
}  // namespace torchbridge::sdk

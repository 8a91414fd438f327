#pragma once
// Factories for the built-in adapters, one small file each. Internal to libtorchbridge.

#include <torchbridge/backend.h>

#include <memory>

namespace torchbridge::adapters {

std::shared_ptr<Backend> make_cpu_backend();
std::shared_ptr<Backend> make_cuda_backend();
std::shared_ptr<Backend> make_rocm_backend();
std::shared_ptr<Backend> make_xpu_backend();
std::shared_ptr<Backend> make_mps_backend();
std::shared_ptr<Backend> make_tpu_backend();
std::shared_ptr<Backend> make_privateuse1_backend();

}  // namespace torchbridge::adapters

#pragma once
// The contract every TorchBridge backend must meet, parameterized over each device available in
// the process: the CPU, the SDK device (emu by default; TORCHBRIDGE_CONTRACT_SDK_DEVICE picks
// another, e.g. cudasdk on a GPU machine), and CUDA when torch has a GPU.

#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace torchbridge::contract {

// Backend names under test, decided once per process without loading or initialising anything.
const std::vector<std::string>& contract_backends();

class Contract : public ::testing::TestWithParam<std::string> {
 protected:
  // Creates the backend (loading the SDK device on first use); skips, saying why, when this
  // process already holds another accelerator.
  void SetUp() override;
  Backend& backend() { return *backend_; }
  c10::Device device(int index = 0) { return backend_->device(index); }
  bool is_cpu() const { return GetParam() == "cpu"; }

 private:
  std::shared_ptr<Backend> backend_;
};

// Bitwise equality of two CPU tensors of the same dtype and shape (NaNs included).
::testing::AssertionResult bit_equal(const at::Tensor& a, const at::Tensor& b);

}  // namespace torchbridge::contract

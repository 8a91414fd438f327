#include "contract.h"

#include <torchbridge/sdk/device.h>

#include <cstdlib>

namespace torchbridge::contract {
namespace {

std::string load_error;

std::vector<std::string> discover() {
  std::vector<std::string> names = {"cpu"};
  const char* requested = std::getenv("TORCHBRIDGE_CONTRACT_SDK_DEVICE");
  const std::string sdk_device = requested != nullptr ? requested : "emu";
  if (!sdk_device.empty()) {
    try {
      sdk::load_device(sdk_device);
      names.push_back(sdk_device);
    } catch (const std::exception& e) {
      load_error = e.what();
    }
  }
  if (BackendRegistry::instance().lookup("cuda")->is_available()) names.push_back("cuda");
  return names;
}

}  // namespace

const std::vector<std::string>& contract_backends() {
  static const std::vector<std::string> names = discover();
  return names;
}

const std::string& sdk_load_error() {
  contract_backends();
  return load_error;
}

::testing::AssertionResult bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) {
    return ::testing::AssertionFailure() << "shape/dtype differ: " << a.sizes() << " " << a.dtype() << " vs "
                                         << b.sizes() << " " << b.dtype();
  }
  const at::Tensor x = a.contiguous().view(at::kByte), y = b.contiguous().view(at::kByte);
  if (at::equal(x, y)) return ::testing::AssertionSuccess();
  const int64_t differing = at::ne(x, y).sum().item<int64_t>();
  return ::testing::AssertionFailure() << differing << " of " << x.numel() << " bytes differ";
}

// The SDK device must load on every machine (emu needs no hardware); a failure is a defect.
TEST(ContractSetup, SdkDeviceLoaded) {
  const char* requested = std::getenv("TORCHBRIDGE_CONTRACT_SDK_DEVICE");
  if (requested != nullptr && *requested == '\0') GTEST_SKIP() << "SDK device disabled by the environment";
  EXPECT_EQ(sdk_load_error(), "");
}

}  // namespace torchbridge::contract

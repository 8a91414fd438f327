#include "contract.h"

#include <torchbridge/one_accelerator.h>
#include <torchbridge/sdk/device.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::contract {
namespace {

// The SDK device under test: TORCHBRIDGE_CONTRACT_SDK_DEVICE, "emu" by default, "" for none.
std::string requested_sdk_device() {
  const char* requested = std::getenv("TORCHBRIDGE_CONTRACT_SDK_DEVICE");
  return requested != nullptr ? requested : "emu";
}

// Names only: nothing is loaded or initialised here, because CTest runs every test in its own
// process and each process must touch a single accelerator (one_accelerator.h). Listing the
// tests must not register the SDK device in the process that then tests CUDA.
std::vector<std::string> discover() {
  std::vector<std::string> names = {"cpu"};
  const std::string sdk_device = requested_sdk_device();
  const auto found = sdk::available_devices();
  if (!sdk_device.empty() && std::find(found.begin(), found.end(), sdk_device) != found.end()) {
    names.push_back(sdk_device);
  }
  if (BackendRegistry::instance().lookup("cuda")->is_available()) names.push_back("cuda");
  return names;
}

}  // namespace

const std::vector<std::string>& contract_backends() {
  static const std::vector<std::string> names = discover();
  return names;
}

void Contract::SetUp() {
  const std::string& name = GetParam();
  if (name != "cpu") {
    // Run by hand as one process, the suite would reach CUDA after registering the SDK device (or
    // the reverse); TorchBridge refuses that mix (one_accelerator.h), so say how to run it instead.
    const auto sdk_device = registered_privateuse1_device();
    const bool wants_sdk = name == requested_sdk_device();
    if (!wants_sdk && sdk_device) {
      GTEST_SKIP() << "SDK device '" << *sdk_device << "' is registered in this process, so " << name
                   << " cannot be tested here: run one device per process (ctest does; or --gtest_filter='*/" << name
                   << "')";
    }
    // Once the SDK device is registered, a CUDA context may be its own (cudasdk's runtime is CUDA):
    // only a context that existed before it was loaded means the process used a native accelerator.
    if (wants_sdk && sdk_device != name) {
      if (const auto native = native_accelerator_in_use()) {
        GTEST_SKIP() << "this process already used " << *native << ", so SDK device " << name
                     << " cannot be loaded here: run one device per process (ctest does; or --gtest_filter='*/"
                     << name << "')";
      }
    }
  }
  backend_ = create_backend(name);  // loads the SDK device on first use
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
TEST(ContractSetup, SdkDeviceLoads) {
  const std::string name = requested_sdk_device();
  if (name.empty()) GTEST_SKIP() << "SDK device disabled by the environment";
  const auto found = sdk::available_devices();
  ASSERT_NE(std::find(found.begin(), found.end(), name), found.end())
      << "no device library for '" << name << "' on the search path";
  EXPECT_NO_THROW(sdk::load_device(name));
  EXPECT_EQ(sdk::registered_device(), name);
}

}  // namespace torchbridge::contract

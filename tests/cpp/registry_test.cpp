// Backend names, aliases, priority order, the environment override and every error path.
#include <torchbridge/registry.h>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "error_message.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge {
namespace {

using test_support::error_of;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

// Tests of the PrivateUse1 name before any device renamed it: CTest runs each test in a process of
// its own; in one gtest process after a test that loaded a device they skip, saying why.
bool privateuse1_renamed() { return c10::get_privateuse1_backend() != "privateuseone"; }
constexpr const char* kNeedsAFreshProcess =
    "PrivateUse1 is already renamed in this process (CTest runs this test alone, where it is not)";

// Installs a name resolver for the test's scope, then puts back the one it replaced (the SDK's,
// which loads devices by name), also when the test body throws.
class ScopedNameResolver {
 public:
  explicit ScopedNameResolver(BackendRegistry::NameResolver resolver)
      : previous_(BackendRegistry::instance().set_name_resolver(std::move(resolver))) {}
  ~ScopedNameResolver() { BackendRegistry::instance().set_name_resolver(previous_.first, previous_.second); }
  ScopedNameResolver(const ScopedNameResolver&) = delete;
  ScopedNameResolver& operator=(const ScopedNameResolver&) = delete;

 private:
  std::pair<BackendRegistry::NameResolver, BackendRegistry::LoadableNames> previous_;
};

TEST(Registry, EntriesAreInDetectionPriorityOrder) {
  if (privateuse1_renamed()) GTEST_SKIP() << kNeedsAFreshProcess;
  std::vector<std::string> names;
  for (const auto& entry : BackendRegistry::instance().entries()) names.push_back(entry.name);
  EXPECT_EQ(names, (std::vector<std::string>{"cuda", "rocm", "xpu", "mps", "tpu", "privateuseone", "cpu"}));
}

TEST(Registry, AliasesResolveToTheSameBackend) {
  if (privateuse1_renamed()) GTEST_SKIP() << kNeedsAFreshProcess;
  const auto& registry = BackendRegistry::instance();
  const std::vector<std::pair<std::string, std::string>> aliases = {
      {"nvidia", "cuda"}, {"hip", "rocm"}, {"amd", "rocm"},  {"intel", "xpu"},
      {"apple", "mps"},   {"xla", "tpu"},  {"privateuse1", "privateuseone"}, {"CUDA", "cuda"}};
  for (const auto& [alias, canonical] : aliases) {
    EXPECT_EQ(registry.lookup(alias), registry.lookup(canonical)) << alias;
    EXPECT_EQ(registry.lookup(alias)->name(), canonical) << alias;
  }
}

TEST(Registry, BackendsReportTheirTorchDeviceType) {
  const auto& registry = BackendRegistry::instance();
  EXPECT_EQ(registry.lookup("cuda")->device_type(), c10::DeviceType::CUDA);
  EXPECT_EQ(registry.lookup("rocm")->device_type(), c10::DeviceType::CUDA);  // ROCm torch reuses it
  EXPECT_EQ(registry.lookup("xpu")->device_type(), c10::DeviceType::XPU);
  EXPECT_EQ(registry.lookup("mps")->device_type(), c10::DeviceType::MPS);
  EXPECT_EQ(registry.lookup("tpu")->device_type(), c10::DeviceType::XLA);
  EXPECT_EQ(registry.lookup("privateuseone")->device_type(), c10::DeviceType::PrivateUse1);
  EXPECT_EQ(registry.lookup("cpu")->device_type(), c10::DeviceType::CPU);
}

TEST(Registry, UnknownNameListsValidNames) {
  const std::string message = error_of([] { BackendRegistry::instance().lookup("quantum"); });
  EXPECT_NE(message.find("unknown backend 'quantum'"), std::string::npos) << message;
  for (const char* valid : {"cpu", "cuda", "nvidia", "rocm", "hip", "xpu", "mps", "tpu"}) {
    EXPECT_NE(message.find(valid), std::string::npos) << valid << " missing from: " << message;
  }
}

TEST(Registry, DeviceStringIsRejectedWithAHint) {
  const std::string message = error_of([] { BackendRegistry::instance().lookup("cuda:0"); });
  EXPECT_NE(message.find("unknown backend 'cuda:0'"), std::string::npos) << message;
  EXPECT_NE(message.find("carries no device index"), std::string::npos) << message;
}

TEST(Registry, CreateRaisesWithTheReasonForUnavailableBackends) {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    const Availability availability = entry.backend->availability();
    if (availability.available()) {
      EXPECT_EQ(create_backend(entry.name), entry.backend);
    } else {
      const std::string message = error_of([&] { create_backend(entry.name); });
      EXPECT_NE(message.find("not available"), std::string::npos) << message;
      EXPECT_NE(message.find(availability.reason), std::string::npos) << message;
    }
  }
}

TEST(Registry, NoSilentFallbackForMissingAccelerators) {
  // On this build CUDA is compiled in or not; either way create() returns CUDA or raises.
  const auto cuda = BackendRegistry::instance().lookup("cuda");
  if (cuda->is_available()) GTEST_SKIP() << "an NVIDIA GPU is available here";
  EXPECT_THROW(create_backend("nvidia"), c10::Error);
}

// The expected best backend, computed from each backend's own availability.
std::string expected_best() {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    if ((entry.name == "cpu" || entry.backend->is_real_hardware()) && entry.backend->is_available()) {
      return entry.name;
    }
  }
  return "";
}

TEST(Registry, DetectBestBackendFollowsPriority) {
  unsetenv(kBackendEnvVar);
  EXPECT_EQ(detect_best_backend(), expected_best());
}

TEST(Registry, EnvironmentOverrideSelectsBackendByAlias) {
  ScopedEnv env(kBackendEnvVar, "CPU");
  EXPECT_EQ(detect_best_backend(), "cpu");
}

TEST(Registry, EmptyEnvironmentValueMeansUnset) {
  ScopedEnv env(kBackendEnvVar, "");
  EXPECT_EQ(detect_best_backend(), expected_best());
}

// The configuration documents TORCHBRIDGE_BACKEND=auto; detection read it as a backend's name.
TEST(Registry, AutoInTheEnvironmentMeansDetect) {
  for (const char* value : {"auto", "AUTO", "Auto"}) {
    ScopedEnv env(kBackendEnvVar, value);
    EXPECT_EQ(detect_best_backend(), expected_best()) << value;
  }
}

TEST(Registry, MalformedEnvironmentValueIsAnError) {
  for (const char* bad : {"bogus", "cuda:0", " cpu", "cpu,cuda"}) {
    ScopedEnv env(kBackendEnvVar, bad);
    const std::string message = error_of([] { detect_best_backend(); });
    EXPECT_NE(message.find(std::string("TORCHBRIDGE_BACKEND='") + bad + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("valid names"), std::string::npos) << message;
  }
}

TEST(Registry, EnvironmentNamingUnavailableBackendIsAnErrorNotAFallback) {
  if (BackendRegistry::instance().lookup("tpu")->is_available()) GTEST_SKIP() << "tpu available";
  ScopedEnv env(kBackendEnvVar, "xla");
  const std::string message = error_of([] { detect_best_backend(); });
  EXPECT_NE(message.find("not available"), std::string::npos) << message;
  EXPECT_NE(message.find("torch_xla"), std::string::npos) << message;
}

TEST(Registry, RegisteredPrivateUse1NameBecomesCanonical) {
  if (privateuse1_renamed()) GTEST_SKIP() << kNeedsAFreshProcess;
  c10::register_privateuse1_backend("testdev");
  const auto& registry = BackendRegistry::instance();
  EXPECT_EQ(registry.lookup("testdev"), registry.lookup("privateuseone"));
  EXPECT_EQ(registry.lookup("testdev")->name(), "testdev");
  const auto names = registry.valid_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "testdev"), names.end());
  // Renamed but with no guard registered, the adapter says so instead of pretending.
  EXPECT_EQ(registry.lookup("testdev")->availability().status, AvailabilityStatus::kNotRegistered);
}

TEST(Registry, NameResolverIsConsultedForUnknownNames) {
  if (privateuse1_renamed()) GTEST_SKIP() << kNeedsAFreshProcess;
  auto& registry = BackendRegistry::instance();
  std::vector<std::string> asked;
  const ScopedNameResolver resolver([&](const std::string& name) {
    asked.push_back(name);
    if (name != "lazydev") return false;
    c10::register_privateuse1_backend("lazydev");  // what an SDK loader does
    return true;
  });
  EXPECT_EQ(registry.lookup("lazydev")->name(), "lazydev");
  EXPECT_THROW(registry.lookup("nothing"), c10::Error);
  EXPECT_EQ(asked, (std::vector<std::string>{"lazydev", "nothing"}));
}

}  // namespace
}  // namespace torchbridge

#include <torchbridge/health.h>
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

TEST(HealthCheck, PassesOnEveryAvailableDevice) {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    for (int i = 0; i < entry.backend->device_count(); ++i) {
      const HealthCheckResult r = run_health_check(*entry.backend, i, 1 << 20);
      EXPECT_TRUE(r.passed) << entry.name << ":" << i << ": " << r.detail;
      EXPECT_NE(r.detail.find("bit-exact"), std::string::npos);
      EXPECT_GT(r.duration_ms, 0.0);
    }
  }
}

TEST(HealthCheck, ReportsUnavailableBackendAsFailureWithReason) {
  auto tpu = BackendRegistry::instance().lookup("tpu");
  const HealthCheckResult r = run_health_check(*tpu, 0);
  EXPECT_FALSE(r.passed);
  EXPECT_NE(r.detail.find("torch_xla"), std::string::npos) << r.detail;
  EXPECT_EQ(r.detail.find('\n'), std::string::npos) << "backtrace leaked into the report";
}

// -5 gave torch's "upper bound and lower bound inconsistent with step sign"; 0 passed, checking
// nothing; 6 reported "copied 6 bytes" for the 4 it copied.
TEST(HealthCheck, ASizeThatIsNoPositiveMultipleOfTheElementIsRefused) {
  auto cpu = BackendRegistry::instance().lookup("cpu");
  for (const int64_t bytes : {int64_t{-5}, int64_t{0}, int64_t{6}}) {
    try {
      run_health_check(*cpu, 0, bytes);
      ADD_FAILURE() << bytes << " was accepted";
    } catch (const c10::ValueError& error) {
      EXPECT_NE(std::string(error.what()).find("bytes must be a positive multiple of 4 (the pattern is int32 "
                                               "elements), got " + std::to_string(bytes)),
                std::string::npos)
          << error.what();
    }
  }
  const HealthCheckResult r = run_health_check(*cpu, 0, (int64_t{3} << 20) + 4);  // past one pattern chunk
  EXPECT_TRUE(r.passed) << r.detail;
}

}  // namespace
}  // namespace torchbridge

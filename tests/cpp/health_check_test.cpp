#include <torchbridge/health.h>
#include <torchbridge/registry.h>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace torchbridge

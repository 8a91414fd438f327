// Bad input to the backend API: clear errors naming the bad value and the valid ones.
#include <torchbridge/registry.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

TEST(BackendErrors, OutOfRangeIndexNamesTheIndexAndTheValidRange) {
  auto cpu = create_backend("cpu");
  for (int bad : {1, -1, 7}) {
    try {
      cpu->device(bad);
      FAIL() << "index " << bad << " accepted";
    } catch (const c10::IndexError& e) {
      EXPECT_NE(e.msg().find("device index " + std::to_string(bad)), std::string::npos) << e.msg();
      EXPECT_NE(e.msg().find("valid index: 0"), std::string::npos) << e.msg();
    }
    EXPECT_THROW(cpu->info(bad), c10::IndexError);
    EXPECT_THROW(cpu->memory_stats(bad), c10::IndexError);
    EXPECT_THROW(cpu->synchronize(bad), c10::IndexError);
  }
}

TEST(BackendErrors, UnavailableBackendsRaiseTheirReasonFromEveryDeviceCall) {
  for (const auto& entry : BackendRegistry::instance().entries()) {
    Backend& backend = *entry.backend;
    const Availability availability = backend.availability();
    if (availability.available()) continue;
    EXPECT_FALSE(availability.reason.empty()) << entry.name;
    EXPECT_EQ(backend.device_count(), 0) << entry.name;
    const std::vector<std::function<void()>> calls = {
        [&] { backend.device(0); },          [&] { backend.info(0); },
        [&] { backend.memory_stats(0); },    [&] { backend.reset_peak_memory_stats(0); },
        [&] { backend.synchronize(0); },     [&] { backend.current_stream(0); },
        [&] { backend.new_stream(0); },      [&] { backend.new_event(false); },
        [&] { backend.empty_cache(); }};
    for (size_t i = 0; i < calls.size(); ++i) {
      try {
        calls[i]();
        ADD_FAILURE() << entry.name << ": call " << i << " succeeded on an unavailable backend";
      } catch (const c10::Error& e) {
        EXPECT_NE(e.msg().find(availability.reason), std::string::npos) << entry.name << ": " << e.msg();
      }
    }
  }
}

TEST(BackendErrors, TpuSaysItIsServedByThePythonPackage) {
  const Availability a = BackendRegistry::instance().lookup("tpu")->availability();
  EXPECT_EQ(a.status, AvailabilityStatus::kPythonOnly);
  EXPECT_NE(a.reason.find("torch_xla"), std::string::npos);
}

TEST(BackendErrors, OptLevelParsing) {
  EXPECT_EQ(parse_opt_level("O0"), OptLevel::O0);
  EXPECT_EQ(parse_opt_level("o3"), OptLevel::O3);
  for (const char* bad : {"O4", "", "fast", "0"}) {
    try {
      parse_opt_level(bad);
      FAIL() << bad;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(e.msg().find(std::string("'") + bad + "'"), std::string::npos) << e.msg();
      EXPECT_NE(e.msg().find("O0, O1, O2, O3"), std::string::npos) << e.msg();
    }
  }
}

}  // namespace
}  // namespace torchbridge

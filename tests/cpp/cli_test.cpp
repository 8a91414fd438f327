// Runs the built `torchbridge` binary and checks its exit codes, JSON and error messages.
#include <torchbridge/precision.h>
#include <torchbridge/precision_policy.h>
#include <torchbridge/registry.h>
#include <torchbridge/remove_tree.h>
#include <torchbridge/version.h>

#include <ATen/detail/CUDAHooksInterface.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace torchbridge {
namespace {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the CLI with `args` under `env_prefix` (e.g. "TORCHBRIDGE_BACKEND=x"), capturing both streams.
CommandResult run_cli(const std::string& args, const std::string& env_prefix = "") {
  char err_path[] = "/tmp/torchbridge-cli-stderr-XXXXXX";
  const int fd = mkstemp(err_path);
  close(fd);
  const std::string command = "env -u TORCHBRIDGE_BACKEND " + env_prefix + " " + TORCHBRIDGE_CLI_PATH +
                              " " + args + " 2>" + err_path;
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  result.err = ss.str();
  unlink(err_path);
  return result;
}

TEST(Cli, InfoJsonListsEveryBackendWithItsStatus) {
  const CommandResult r = run_cli("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["schema_version"], 1);
  EXPECT_EQ(json["torchbridge_version"], TORCHBRIDGE_VERSION_STRING);
  EXPECT_EQ(json["best_backend"], detect_best_backend());
  const auto entries = BackendRegistry::instance().entries();
  ASSERT_EQ(json["backends"].size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& b = json["backends"][i];
    const Availability a = entries[i].backend->availability();
    EXPECT_EQ(b["name"], entries[i].name);
    EXPECT_EQ(b["available"], a.available());
    EXPECT_EQ(b["status"], to_string(a.status));
    EXPECT_EQ(b["device_count"], entries[i].backend->device_count());
    EXPECT_EQ(b["devices"].size(), static_cast<size_t>(entries[i].backend->device_count()));
    if (!a.available()) {
      EXPECT_EQ(b["reason"], a.reason);
    }
  }
}

TEST(Cli, InfoJsonDescribesTheCpuLikeTheLibrary) {
  const auto json = nlohmann::json::parse(run_cli("info --json --backend cpu").out);
  ASSERT_EQ(json["backends"].size(), 1u);
  const auto& device = json["backends"][0]["devices"][0];
  const DeviceInfo info = create_backend("cpu")->info(0);
  EXPECT_EQ(device["info"]["name"], info.name);
  EXPECT_EQ(device["info"]["cpu"]["logical_cores"], info.cpu->logical_cores);
  EXPECT_EQ(device["info"]["cpu"]["physical_cores"], info.cpu->physical_cores);
  EXPECT_EQ(device["info"]["total_memory_bytes"], *info.total_memory_bytes);
  EXPECT_GT(device["memory"]["allocated_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(device["memory"]["reserved_bytes"].is_null());
  EXPECT_TRUE(device["error"].is_null());
  // What "auto" chooses here and why, and how each precision runs: the library's own decision.
  const PrecisionDecision decision = decide_precision(info, "auto");
  EXPECT_EQ(device["precision"]["requested"], "auto");
  EXPECT_EQ(device["precision"]["precision"], name_of(decision.precision));
  EXPECT_EQ(device["precision"]["reason"], decision.reason);
  const auto capabilities = precision_capabilities(info);
  ASSERT_EQ(device["precision"]["capabilities"].size(), capabilities.size());
  for (size_t i = 0; i < capabilities.size(); ++i) {
    EXPECT_EQ(device["precision"]["capabilities"][i]["precision"], name_of(capabilities[i].precision));
    EXPECT_EQ(device["precision"]["capabilities"][i]["support"], to_string(capabilities[i].support));
  }
}

TEST(Cli, InfoBackendAcceptsAliases) {
  const auto json = nlohmann::json::parse(run_cli("info --json --backend=nvidia").out);
  ASSERT_EQ(json["backends"].size(), 1u);
  EXPECT_EQ(json["backends"][0]["name"], "cuda");
}

TEST(Cli, InfoHumanOutputShowsTheTable) {
  const CommandResult r = run_cli("info");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("BACKEND"), std::string::npos);
  EXPECT_NE(r.out.find("cpu:0"), std::string::npos);
  EXPECT_NE(r.out.find("best backend: " + detect_best_backend()), std::string::npos);
  const PrecisionDecision decision = decide_precision(create_backend("cpu")->info(0), "auto");
  EXPECT_NE(r.out.find(std::string("auto precision ") + name_of(decision.precision) + " (" + decision.reason + ")"),
            std::string::npos)
      << r.out;
}

// info reports; it does not fail: an SDK device whose runtime refuses to start is a backend that
// is unavailable, with the runtime's reason, as a CUDA driver error is (it exited 1 with the error).
TEST(Cli, InfoListsAnSdkDeviceThatFailsToStartAsUnavailable) {
  const CommandResult r = run_cli("info --json --backend emu", "TORCHBRIDGE_EMU_DEVICES=abc");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["backends"].size(), 1u);
  const auto& emu = json["backends"][0];
  EXPECT_EQ(emu["name"], "emu");
  EXPECT_EQ(emu["available"], false);
  EXPECT_EQ(emu["status"], "driver_error");
  EXPECT_NE(emu["reason"].get<std::string>().find("device 'emu' failed to start: TORCHBRIDGE_EMU_DEVICES='abc'"),
            std::string::npos)
      << emu["reason"];
  EXPECT_EQ(emu["device_count"], 0);

  const CommandResult text = run_cli("info --backend emu", "TORCHBRIDGE_EMU_DEVICES=abc");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("emu            driver_error"), std::string::npos) << text.out;
}

// Listing every backend loads no SDK device, so it names those --backend can load.
TEST(Cli, InfoNamesTheInstalledSdkDevices) {
  const auto json = nlohmann::json::parse(run_cli("info --json").out);
  const auto installed = json["installed_sdk_devices"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(installed.begin(), installed.end(), "emu"), installed.end()) << json["installed_sdk_devices"];
  EXPECT_NE(run_cli("info").out.find("SDK devices installed here: "), std::string::npos);
}

TEST(Cli, UnknownBackendIsAnErrorListingValidNames) {
  const CommandResult r = run_cli("info --backend warp-drive");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("unknown backend 'warp-drive'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("valid names: "), std::string::npos) << r.err;
}

TEST(Cli, DoctorIsHealthyHereAndChecksEveryDevice) {
  const CommandResult r = run_cli("doctor --json");
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(r.exit_code, json["exit_code"].get<int>());
  EXPECT_EQ(json["torch"]["compiled"]["cuda"], at::detail::getCUDAHooks().isBuilt() && !at::detail::getCUDAHooks().hasROCM());
  int health_checks = 0;
  for (const auto& check : json["checks"]) {
    if (check["name"].get<std::string>().find(" health") == std::string::npos) continue;
    ++health_checks;
    EXPECT_EQ(check["outcome"], "ok") << check.dump();
    EXPECT_GT(check["duration_ms"].get<double>(), 0.0);
  }
  int devices = 0;
  for (const auto& entry : BackendRegistry::instance().entries()) devices += entry.backend->device_count();
  EXPECT_EQ(health_checks, devices);
  if (r.exit_code == 0) {
    EXPECT_EQ(json["outcome"], "ok");
  }
}

TEST(Cli, DoctorFailsWhenTheOverrideNamesABadBackend) {
  const CommandResult r = run_cli("doctor --json", "TORCHBRIDGE_BACKEND=bogus");
  EXPECT_EQ(r.exit_code, 1);
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["outcome"], "failure");
  EXPECT_EQ(json["environment_overrides"]["TORCHBRIDGE_BACKEND"], "bogus");
}

const nlohmann::json* check_named(const nlohmann::json& doctor, const std::string& name) {
  for (const auto& check : doctor["checks"]) {
    if (check["name"] == name) return &check;
  }
  return nullptr;
}

// The compiler torch's inductor uses ($CXX, else g++), probed as doctor probes it: a toolchain that
// copies libstdc++ into shared libraries (the GPU images' /opt/gcc, emulated here by adding
// -static-libstdc++ to g++'s shared links, as tests/python/test_export_successors.py does) is a
// warning; the machine's g++ is not; a CXX that cannot be started is a warning naming it.
// The probe builds in a temporary directory: where none can be made, the check says so and why.
TEST(Cli, DoctorCannotTellTheCompilerRuntimeWithoutATemporaryDirectory) {
  const auto json = nlohmann::json::parse(run_cli("doctor --json", "TMPDIR=/nonexistent/tmp").out);
  const nlohmann::json* check = check_named(json, "C++ compiler runtime");
  ASSERT_NE(check, nullptr) << json.dump();
  EXPECT_EQ((*check)["outcome"], "warning");
  EXPECT_NE((*check)["detail"].get<std::string>().find("cannot create a temporary directory in /nonexistent/tmp "
                                                       "(TMPDIR): No such file or directory"),
            std::string::npos)
      << (*check)["detail"];
}

TEST(Cli, DoctorWarnsWhereTheCompilerWouldCopyTheCxxRuntimeIntoLibraries) {
  const auto plain = nlohmann::json::parse(run_cli("doctor --json", "CXX=g++").out);
  const nlohmann::json* shared = check_named(plain, "C++ compiler runtime");
  ASSERT_NE(shared, nullptr) << plain.dump();
  const std::string detail = (*shared)["detail"];
  if (detail.starts_with("no C++ compiler")) GTEST_SKIP() << "no g++ on this machine: " << detail;
  if ((*shared)["outcome"] == "warning" && detail.find("copies libstdc++") != std::string::npos) {
    GTEST_SKIP() << "this machine's g++ itself copies the runtime (the control below would show nothing): " << detail;
  }
  EXPECT_EQ((*shared)["outcome"], "ok") << detail;
  EXPECT_NE(detail.find("links the shared C++ runtime"), std::string::npos) << detail;

  char folder[] = "/tmp/torchbridge-static-toolchain-XXXXXX";
  ASSERT_NE(mkdtemp(folder), nullptr);
  const std::string wrapper = std::string(folder) + "/g++";
  std::ofstream(wrapper) << "#!/bin/sh\n"
                            "for a in \"$@\"; do [ \"$a\" = -shared ] && exec g++ -static-libstdc++ \"$@\"; done\n"
                            "exec g++ \"$@\"\n";
  ASSERT_EQ(chmod(wrapper.c_str(), 0755), 0);
  const CommandResult copying = run_cli("doctor --json", "CXX=" + wrapper);
  remove_tree(folder);
  const auto json = nlohmann::json::parse(copying.out);
  const nlohmann::json* copied = check_named(json, "C++ compiler runtime");
  ASSERT_NE(copied, nullptr) << json.dump();
  EXPECT_EQ((*copied)["outcome"], "warning");
  EXPECT_NE((*copied)["detail"].get<std::string>().find(wrapper + " copies libstdc++ into the shared libraries it "
                                                        "builds"),
            std::string::npos)
      << (*copied)["detail"];
  EXPECT_NE(copying.exit_code, 0);  // 2 (warnings) unless something else here fails
  EXPECT_EQ(json["environment_overrides"]["CXX"], wrapper);

  const auto missing = nlohmann::json::parse(run_cli("doctor --json", "CXX=/nonexistent/c++").out);
  const nlohmann::json* absent = check_named(missing, "C++ compiler runtime");
  ASSERT_NE(absent, nullptr);
  EXPECT_EQ((*absent)["outcome"], "warning");
  EXPECT_NE((*absent)["detail"].get<std::string>().find("CXX names a compiler that cannot be started (cannot start "
                                                        "/nonexistent/c++"),
            std::string::npos)
      << (*absent)["detail"];
}

// A vendor checking a device library: doctor loads the SDK device by name and checks each of its
// devices (here emu, told to have 3), and reports the TORCHBRIDGE_* variables that shaped it.
TEST(Cli, DoctorChecksOneBackendByNameLoadingAnSdkDevice) {
  const CommandResult r = run_cli("doctor --json --backend emu", "TORCHBRIDGE_EMU_DEVICES=3");
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(r.exit_code, json["exit_code"].get<int>()) << r.err;
  std::vector<std::string> health;
  std::string libraries;
  for (const auto& check : json["checks"]) {
    const auto name = check["name"].get<std::string>();
    // Every check passes but the compiler's, which is the machine's toolchain (a GPU image's warns).
    if (name != "C++ compiler runtime") {
      EXPECT_EQ(check["outcome"], "ok") << check.dump();
    }
    if (name.find(" health") != std::string::npos) {
      health.push_back(name);
      EXPECT_EQ(check["outcome"], "ok") << check.dump();
    }
    if (name == "SDK device libraries") libraries = check["detail"].get<std::string>();
  }
  EXPECT_EQ(health, (std::vector<std::string>{"emu:0 health", "emu:1 health", "emu:2 health"}));
  EXPECT_NE(libraries.find("emu"), std::string::npos) << libraries;
  EXPECT_EQ(json["environment_overrides"]["TORCHBRIDGE_EMU_DEVICES"], "3");
}

TEST(Cli, DoctorFailsNamingABackendItCannotLoad) {
  const CommandResult r = run_cli("doctor --json --backend warp-drive");
  EXPECT_EQ(r.exit_code, 1);
  const auto json = nlohmann::json::parse(r.out);
  bool named = false;
  for (const auto& check : json["checks"]) {
    if (check["name"] == "warp-drive load") {
      named = check["outcome"] == "failure" &&
              check["detail"].get<std::string>().find("unknown backend 'warp-drive'") != std::string::npos;
    }
  }
  EXPECT_TRUE(named) << r.out;
}

TEST(Cli, DoctorWarnsWhenGpusAreHidden) {
  const CommandResult r = run_cli("doctor --json", "CUDA_VISIBLE_DEVICES=");
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(json["outcome"], "warning");
}

// A variable one letter off the one meant is set, read by nothing, and its setting silently lost;
// names far from every variable TorchBridge reads (the scripts' and devices' own) draw nothing.
TEST(Cli, DoctorNamesTheVariableAMisspelledOneWasMeantToBe) {
  const CommandResult typo = run_cli("doctor --json", "TORCHBRIDGE_BACKNED=emu");
  const auto json = nlohmann::json::parse(typo.out);
  EXPECT_EQ(typo.exit_code, 2) << typo.out;
  const nlohmann::json* check = check_named(json, "TORCHBRIDGE_BACKNED");
  ASSERT_NE(check, nullptr) << typo.out;
  EXPECT_EQ((*check)["outcome"], "warning");
  EXPECT_NE((*check)["detail"].get<std::string>().find("did you mean TORCHBRIDGE_BACKEND?"), std::string::npos)
      << typo.out;
  const auto config_field = nlohmann::json::parse(run_cli("doctor --json", "TORCHBRIDGE_PRECISSION=bf16").out);
  ASSERT_NE(check_named(config_field, "TORCHBRIDGE_PRECISSION"), nullptr);
  EXPECT_NE((*check_named(config_field, "TORCHBRIDGE_PRECISSION"))["detail"].get<std::string>().find(
                "TORCHBRIDGE_PRECISION?"),
            std::string::npos);

  const CommandResult others = run_cli(
      "doctor --json", "TORCHBRIDGE_JOBS=2 TORCHBRIDGE_EMU_DEVICES=2 TORCHBRIDGE_LOG_LEVEL=INFO TORCHBRIDGE_PRECISION=fp32");
  const auto quiet = nlohmann::json::parse(others.out);
  for (const char* name : {"TORCHBRIDGE_JOBS", "TORCHBRIDGE_EMU_DEVICES", "TORCHBRIDGE_LOG_LEVEL", "TORCHBRIDGE_PRECISION"}) {
    EXPECT_EQ(check_named(quiet, name), nullptr) << name << ": " << others.out;
    EXPECT_TRUE(quiet["environment_overrides"].contains(name)) << name;
  }
}

TEST(Cli, VersionHelpAndErrors) {
  const CommandResult version = run_cli("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find(TORCHBRIDGE_VERSION_STRING), std::string::npos);
  // -h as well as --help, after a command too ("info -h" was an unknown argument).
  for (const char* command : {"--help", "info --help", "doctor --help", "-h", "info -h", "validate -h",
                              "checkpoint -h", "checkpoint convert -h"}) {
    const CommandResult help = run_cli(command);
    EXPECT_EQ(help.exit_code, 0) << command;
    EXPECT_NE(help.out.find("usage: torchbridge"), std::string::npos) << command;
  }
  const CommandResult run = run_cli("run script.py");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("Python package"), std::string::npos) << run.err;
  const CommandResult unknown = run_cli("teleport");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("unknown command 'teleport'"), std::string::npos) << unknown.err;
  const CommandResult bad_flag = run_cli("info --color");
  EXPECT_EQ(bad_flag.exit_code, 1);
  EXPECT_NE(bad_flag.err.find("unknown argument '--color'"), std::string::npos) << bad_flag.err;
  const CommandResult no_args = run_cli("");
  EXPECT_EQ(no_args.exit_code, 1);
  // Words after --version or --help were ignored; they are a mistake (a command meant before them).
  for (const char* command : {"--version junk", "--help info"}) {
    const CommandResult extra = run_cli(command);
    EXPECT_EQ(extra.exit_code, 1) << command;
    EXPECT_NE(extra.err.find("takes no arguments, got '"), std::string::npos) << extra.err;
    EXPECT_EQ(extra.out, "") << command;
  }
}

}  // namespace
}  // namespace torchbridge

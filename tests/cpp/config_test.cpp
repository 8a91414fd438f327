#include <torchbridge/optimize/config.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cctype>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>

namespace torchbridge {
namespace {

// `fn` raises c10::ValueError whose message contains `expected`.
void expect_value_error(const std::function<void()>& fn, const std::string& expected) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    EXPECT_NE(e.msg().find(expected), std::string::npos) << "message: " << e.msg() << "\nexpected: " << expected;
    return;
  }
  ADD_FAILURE() << "no ValueError; expected one saying: " << expected;
}

std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(Config, PresetsSayWhatTheyAreFor) {
  const auto training = TorchBridgeConfig::for_training();
  EXPECT_EQ(training.optimization_level, OptLevel::O2);
  EXPECT_TRUE(training.training);
  EXPECT_EQ(training.precision, "auto");
  const auto inference = TorchBridgeConfig::for_inference();
  EXPECT_EQ(inference.optimization_level, OptLevel::O3);
  EXPECT_FALSE(inference.training);
  const auto development = TorchBridgeConfig::for_development();
  EXPECT_EQ(development.optimization_level, OptLevel::O0);
  EXPECT_EQ(development.precision, "fp32");
  EXPECT_TRUE(development.deterministic);
  EXPECT_TRUE(development.validation);
  EXPECT_FALSE(development.compile);
}

TEST(Config, JsonRoundTripsEveryField) {
  TorchBridgeConfig config = TorchBridgeConfig::for_inference();
  config.backend = "cpu";
  config.precision = "bf16";
  config.deterministic = true;
  const TorchBridgeConfig back = config_from_json_text(to_json_text(config));
  EXPECT_EQ(to_json_text(back), to_json_text(config));
  EXPECT_EQ(back.backend, "cpu");
  EXPECT_EQ(back.optimization_level, OptLevel::O3);
}

TEST(Config, FieldsAbsentFromADocumentKeepTheBase) {
  const auto config = config_from_json_text(R"({"precision": "fp16"})", TorchBridgeConfig::for_inference());
  EXPECT_EQ(config.precision, "fp16");
  EXPECT_EQ(config.optimization_level, OptLevel::O3);
  EXPECT_FALSE(config.training);
}

TEST(Config, BadDocumentsNameTheKeyAndWhatWasExpected) {
  expect_value_error([&] { config_from_json_text(R"({"precison": "fp16"})", {}, "my.json"); },
                            "my.json: unknown key 'precison'; did you mean 'precision'? The configuration has backend, device_index");
  expect_value_error([&] { config_from_json_text(R"({"colour": "blue"})", {}, "my.json"); },
                            "my.json: unknown key 'colour'; the configuration has backend, device_index");
  expect_value_error([&] { config_from_json_text(R"({"training": "yes"})"); },
                            "'training': expected true or false, got \"yes\"");
  expect_value_error([&] { config_from_json_text(R"({"device_index": -1})"); },
                            "expected a device index from 0 to 1048576, got -1");
  expect_value_error([&] { config_from_json_text(R"({"precision": "fp12"})"); },
                            "precision: unknown precision 'fp12': expected one of fp64, fp32, tf32, fp16, bf16, fp8, or \"auto\"");
  expect_value_error([&] { config_from_json_text(R"({"optimization_level": "O4"})"); }, "O4");
  expect_value_error([&] { config_from_json_text(R"({"backend": "nvidai"})"); }, "nvidai");
  expect_value_error([&] { config_from_json_text("[1, 2]"); }, "expected a JSON object");
  expect_value_error([&] { config_from_json_text("{"); }, "not valid JSON");
}

// Said twice is refused, as in TOML: the JSON library kept the last value silently.
TEST(Config, AFieldGivenTwiceIsRefused) {
  expect_value_error([&] { config_from_json_text(R"({"precision": "fp8", "precision": "fp32"})", {}, "my.json"); },
                     "my.json: key 'precision' is given twice in one object");
  expect_value_error(
      [&] {
        config_from_json_text(R"({"hardware": {"intel": {"enable_onednn": false}}, "hardware.intel.enable_onednn": true})",
                              {}, "my.json");
      },
      "my.json: 'hardware.intel.enable_onednn' is given twice (once as a dotted key, once inside its section)");
  expect_value_error([&] { config_from_json_text(std::string(100, '[') + std::string(100, ']'), {}, "deep.json"); },
                     "deep.json: JSON nests deeper than 64 levels");
}

TEST(Config, TomlFilesReadTheSameFields) {
  const std::string path = write_file("tb_config_test.toml",
                                      "# a comment\n"
                                      "backend = \"cpu\"   # trailing comment\n"
                                      "precision = 'fp32'\n\n"
                                      "optimization_level = \"O1\"\n"
                                      "training = false\n"
                                      "device_index = 0\n");
  const TorchBridgeConfig config = load_config(path);
  EXPECT_EQ(config.backend, "cpu");
  EXPECT_EQ(config.precision, "fp32");
  EXPECT_EQ(config.optimization_level, OptLevel::O1);
  EXPECT_FALSE(config.training);
  std::remove(path.c_str());
}

TEST(Config, TomlItCannotReadIsRefusedByLine) {
  const std::map<std::string, std::string> cases = {
      {"[[hardware]]\n", "line 1: expected a table header such as [hardware.nvidia]"},
      {"backend = \"cpu\"\nprecision = [\"fp32\"]\n", "line 2: arrays and inline tables are not supported"},
      {"training = maybe\n", "line 1: 'maybe' is not a string, integer, float or boolean"},
      {"backend \"cpu\"\n", "line 1: expected 'key = value'"},
      {"backend = \"cpu\nx", "line 1: unterminated string"},
      {"backend = \"cpu\"\nbackend = \"cpu\"\n", "line 2: key 'backend' appears twice"},
      {"backend = \"cpu\" extra\n", "unexpected text after the value"},
      {"precision = 3\n", "'precision': expected a string, got 3"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string path = write_file("tb_bad_config.toml", text);
    expect_value_error([&] { load_config(path); }, expected);
    std::remove(path.c_str());
  }
  expect_value_error([&] { load_config("/nonexistent/x.toml"); }, "cannot read the configuration file");
  const std::string yaml = write_file("tb_config.yaml", "backend: cpu\n");
  expect_value_error([&] { load_config(yaml); }, "expected a .json or .toml file");
  std::remove(yaml.c_str());
}

TEST(Config, EnvironmentVariablesOverrideTheirFields) {
  const std::map<std::string, std::string> environment = {
      {"TORCHBRIDGE_PRECISION", "fp16"}, {"TORCHBRIDGE_OPTIMIZATION_LEVEL", "o1"},
      {"TORCHBRIDGE_COMPILE", "0"},      {"TORCHBRIDGE_DEVICE_INDEX", "0"},
      {"TORCHBRIDGE_BACKEND", ""}};  // empty counts as unset
  const auto getenv = [&](const char* name) -> const char* {
    const auto it = environment.find(name);
    return it == environment.end() ? nullptr : it->second.c_str();
  };
  const TorchBridgeConfig config = with_environment(TorchBridgeConfig::for_training(), getenv);
  EXPECT_EQ(config.precision, "fp16");
  EXPECT_EQ(config.optimization_level, OptLevel::O1);
  EXPECT_FALSE(config.compile);
  EXPECT_EQ(config.backend, "auto");

  const auto bad = [](const char* name) -> const char* {
    return std::string(name) == "TORCHBRIDGE_TRAINING" ? "sometimes" : nullptr;
  };
  expect_value_error([&] { with_environment({}, bad); },
                     "TORCHBRIDGE_TRAINING: expected 1/0, true/false, yes/no or on/off (any case), got 'sometimes'");
  // A value of the right type that is no valid value names its variable, as a file's names the file.
  const auto bad_precision = [](const char* name) -> const char* {
    return std::string(name) == "TORCHBRIDGE_PRECISION" ? "bfloat16x" : nullptr;
  };
  expect_value_error([&] { with_environment({}, bad_precision); },
                     "environment (TORCHBRIDGE_PRECISION='bfloat16x'): precision: ");
  expect_value_error([&] { config_from_json_text(R"({"precision": "fp4"})", {}, "my.json"); },
                     "my.json: precision: ");
  // Booleans in any case, as environment variables are commonly written (TRUE, On).
  for (const auto& spelling : {std::pair<const char*, bool>{"TRUE", true}, {"On", true}, {"No", false}}) {
    const char* text = spelling.first;
    const auto spelled = [text](const char* name) -> const char* {
      return std::string(name) == "TORCHBRIDGE_COMPILE" ? text : nullptr;
    };
    EXPECT_EQ(with_environment(TorchBridgeConfig::for_training(), spelled).compile, spelling.second) << text;
  }
}

TEST(Config, TheSchemaListsEveryFieldWithItsVariable) {
  const std::string json = to_json_text(TorchBridgeConfig{});
  ASSERT_EQ(config_schema().size(), 21u);  // 9 fields, and 12 in the vendor sections
  for (const auto& field : config_schema()) {
    // "hardware.nvidia.fp8_enabled" is written nested: its last part is a key of the JSON, and
    // its variable is TORCHBRIDGE_ and the dotted name in capitals with underscores.
    const std::string name = field.name;
    EXPECT_NE(json.find("\"" + name.substr(name.rfind('.') + 1) + "\""), std::string::npos) << name;
    std::string variable = "TORCHBRIDGE_";
    for (const char c : name) variable += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(field.environment, variable) << name;
    EXPECT_GT(std::string(field.description).size(), 10u) << field.name;
  }
}

}  // namespace
}  // namespace torchbridge

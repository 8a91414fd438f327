// The C++ half of tests/python/test_compiled_model.py: loads an AOTInductor package through
// UnifiedManager::load_compiled on the CPU and runs it.
//   compiled_model_interop PACKAGE IN.safetensors OUT.safetensors LEVEL
// IN holds input0, input1, ... (in order); OUT receives output0, output1, ...; stdout gets the
// manager's report as JSON. Any error: its message on stderr, exit status 1.
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/optimize/compiled_model.h>
#include <torchbridge/optimize/manager.h>

#include <ATen/core/Tensor.h>

#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s PACKAGE IN.safetensors OUT.safetensors LEVEL\n", argv[0]);
    return 2;
  }
  try {
    torchbridge::TorchBridgeConfig config;
    config.backend = "cpu";
    config.optimization_level = torchbridge::parse_opt_level(argv[4]);
    torchbridge::UnifiedManager manager(config);
    torchbridge::CompiledModel model = manager.load_compiled(argv[1]);
    const auto file = torchbridge::checkpoint::SafetensorsFile::open(argv[2]);
    std::vector<at::Tensor> inputs;
    for (std::size_t i = 0; file.contains("input" + std::to_string(i)); ++i) {
      inputs.push_back(file.load("input" + std::to_string(i)));
    }
    const std::vector<at::Tensor> outputs = model.run(inputs);
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (std::size_t i = 0; i < outputs.size(); ++i) named.emplace_back("output" + std::to_string(i), outputs[i]);
    torchbridge::checkpoint::save(argv[3], named);
    std::printf("%s\n", torchbridge::to_json_text(manager.report()).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

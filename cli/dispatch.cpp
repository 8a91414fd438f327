// Command dispatch shared by the C++ binary (main.cpp) and the Python package's console script.
#include "arguments.h"
#include "commands.h"
#include "text_format.h"

#include <torchbridge/error_summary.h>
#include <torchbridge/version.h>

#include <torch/version.h>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

namespace torchbridge::cli {
namespace {

constexpr const char* kUsage = R"(usage: torchbridge [--version] [--help] COMMAND [ARGS]

Commands:
  info      every backend, available or not and why, with device descriptions and memory
  doctor    check this installation and every device; exit 0 healthy, 1 failure, 2 warnings
  checkpoint inspect|verify|convert   safetensors files (see 'torchbridge checkpoint --help')
  validate  does a model compute the same thing on each backend as on the CPU in float64?
  portability  train, checkpoint, reload on every backend, validate: the README's main job
  export    write a model as TorchScript or safetensors (torch.export, AOTInductor, ONNX: the
            Python package's command)
  bench     the SDK, checkpoint and validation micro-benchmarks: one table of ratios
  train     train a built-in model alone or under torchrun (--data-parallel, --zero1,
            --tensor-parallel K, --pipeline-parallel K)
  run       (Python package only) run a CUDA program redirected to this machine's accelerator

Run 'torchbridge COMMAND --help' for a command's options.
)";

int dispatch(const std::vector<std::string>& argv) {
  if (argv.empty()) {
    std::cerr << kUsage;
    return 1;
  }
  const std::string& command = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  const bool asks_for_help = command == "--help" || command == "-h" || command == "help";
  if ((asks_for_help || command == "--version") && !rest.empty()) {
    throw UsageError("'" + command + "' takes no arguments, got '" + rest.front() +
                     "' (for a command's help: torchbridge COMMAND --help)");
  }
  if (asks_for_help) {
    std::cout << kUsage;
    return 0;
  }
  if (command == "--version") {
    std::cout << "torchbridge " << torchbridge::library_version() << " (torch " << TORCH_VERSION << ")\n";
    return 0;
  }
  if (command == "info") return run_info(rest);
  if (command == "doctor") return run_doctor(rest);
  if (command == "checkpoint") return run_checkpoint(rest);
  if (command == "validate") return run_validate(rest);
  if (command == "portability") return run_portability(rest);
  if (command == "export") return run_export(rest);
  if (command == "bench") return run_bench(rest);
  if (command == "train") return run_train(rest);
  if (command == "run") {
    std::cerr << "torchbridge: 'run' needs Python: it is provided by the TorchBridge Python package's "
                 "`torchbridge` command (pip install . from the repository), not by this C++ binary\n";
    return 1;
  }
  throw UsageError("unknown command '" + command + "'; valid commands: info, doctor, checkpoint, validate, portability, export, bench, train, run (Python package)");
}
}  // namespace

int run_cli(const std::vector<std::string>& argv) {
  try {
    const int code = dispatch(argv);
    std::cout.flush();
    // A full disk or a closed pipe lost the output, and the command still exited 0.
    if (!std::cout) {
      std::cerr << "torchbridge: error: writing to standard output failed; the command's output is lost\n";
      return 1;
    }
    return code;
  } catch (const UsageError& e) {
    std::cerr << "torchbridge: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "torchbridge: error: " << error_summary(e.what()) << "\n";
    return 1;
  }
}

}  // namespace torchbridge::cli

#pragma once
// Each `torchbridge` subcommand: takes the arguments after its name, returns the exit code.

#include <string>
#include <vector>

namespace torchbridge::cli {

int run_info(const std::vector<std::string>& args);
int run_doctor(const std::vector<std::string>& args);
int run_checkpoint(const std::vector<std::string>& args);
int run_validate(const std::vector<std::string>& args);
int run_portability(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
// The whole tool: `argv` without the program name. Prints, never throws; returns the exit code.
int run_cli(const std::vector<std::string>& argv);

}  // namespace torchbridge::cli

// `torchbridge`: the command-line front end of the backend layer.
#include "commands.h"

#include <string>
#include <vector>

int main(int argc, char** argv) {
  return torchbridge::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}

#pragma once
// A deliberately small command-line parser: one command word, then --flags and --option VALUE
// (or --option=VALUE). Anything not declared by the command, or an option given twice, is a usage
// error naming it.

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CommandSpec {
  std::set<std::string> flags;    // e.g. "--json"
  std::set<std::string> options;  // e.g. "--backend" (takes a value)
  bool allows_positional = false; // e.g. file names
};

struct ParsedArguments {
  std::vector<std::string> positional;  // only for commands whose spec allows them
  std::set<std::string> flags;
  std::map<std::string, std::string> options;
  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
  const std::string* option(const std::string& name) const {
    const auto it = options.find(name);
    return it == options.end() ? nullptr : &it->second;
  }
};

// Parses the arguments after the command word. "--help" is always accepted as a flag.
ParsedArguments parse_arguments(const std::string& command, const std::vector<std::string>& args,
                                const CommandSpec& spec);

// Refuses, before any work is done, a file to be written that cannot be: `path` names a directory,
// or a directory that is missing or not writable. `option` names the argument in the message.
void check_output_file(const std::string& path, const std::string& option);

// "cpu,emu" -> {"cpu", "emu"}; an empty list or entry, or a name given twice (in any case), is a
// UsageError naming `option` and the text.
std::vector<std::string> split_list(const std::string& text, const std::string& option);

}  // namespace torchbridge::cli

#include "arguments.h"

#include <algorithm>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace torchbridge::cli {

ParsedArguments parse_arguments(const std::string& command, const std::vector<std::string>& args,
                                const CommandSpec& spec) {
  ParsedArguments parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    // -h as at the top level ("torchbridge -h"): "info -h" was an unknown argument.
    std::string arg = args[i] == "-h" ? "--help" : args[i];
    std::string value;
    bool has_inline_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline_value = true;
    }
    if (arg == "--help" || spec.flags.count(arg)) {
      if (has_inline_value) throw UsageError("'" + arg + "' takes no value");
      parsed.flags.insert(arg);
    } else if (spec.options.count(arg)) {
      if (!has_inline_value) {
        if (i + 1 >= args.size()) throw UsageError("'" + arg + "' needs a value");
        value = args[++i];
      }
      if (value.empty()) throw UsageError("'" + arg + "' needs a non-empty value");
      // A second value silently replaced the first (--dtype float16 --dtype bfloat16).
      if (const auto given = parsed.options.find(arg); given != parsed.options.end()) {
        throw UsageError("'" + arg + "' is given twice ('" + given->second + "' and '" + value + "'); give it once");
      }
      parsed.options[arg] = value;
    } else if (spec.allows_positional && arg.rfind("--", 0) != 0) {
      parsed.positional.push_back(args[i]);
    } else {
      std::string valid;
      for (const auto& f : spec.flags) valid += " " + f;
      for (const auto& o : spec.options) valid += " " + o + " VALUE";
      throw UsageError("unknown argument '" + args[i] + "' for '" + command + "'; valid:" + valid +
                       " --help");
    }
  }
  return parsed;
}

void check_output_file(const std::string& path, const std::string& option) {
  std::error_code error;
  if (path.empty()) throw UsageError(option + " is empty; expected a file path");
  if (std::filesystem::is_directory(path, error)) {
    throw UsageError(option + " '" + path + "' is a directory; expected a file path");
  }
  const std::filesystem::path parent = std::filesystem::absolute(path, error).parent_path();
  if (!std::filesystem::is_directory(parent, error)) {
    throw UsageError(option + " '" + path + "': directory '" + parent.string() + "' does not exist");
  }
  if (::access(parent.c_str(), W_OK) != 0) {
    throw UsageError(option + " '" + path + "': directory '" + parent.string() + "' is not writable");
  }
}

std::vector<std::string> split_list(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::set<std::string> seen;  // lower-cased: names are matched without regard to case
  for (std::string item; std::getline(stream, item, ',');) {
    if (item.empty()) throw UsageError(option + " '" + text + "' has an empty entry");
    std::string lower = item;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    // A repeated name ran everything it names again (cpu,cpu: every check four times).
    if (!seen.insert(lower).second) throw UsageError(option + " '" + text + "' names '" + item + "' twice");
    items.push_back(item);
  }
  if (items.empty()) throw UsageError(option + " is empty");
  // getline yields no item after a final comma, so "cpu," read as "cpu".
  if (text.back() == ',') throw UsageError(option + " '" + text + "' has an empty entry");
  return items;
}

}  // namespace torchbridge::cli

#include "arguments.h"

#include <sstream>
#include <string>
#include <vector>

namespace torchbridge::cli {

ParsedArguments parse_arguments(const std::string& command, const std::vector<std::string>& args,
                                const CommandSpec& spec) {
  ParsedArguments parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
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

std::vector<std::string> split_list(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (item.empty()) throw UsageError(option + " '" + text + "' has an empty entry");
    items.push_back(item);
  }
  if (items.empty()) throw UsageError(option + " is empty");
  return items;
}

}  // namespace torchbridge::cli

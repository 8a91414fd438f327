#include "arguments.h"

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

}  // namespace torchbridge::cli

#include <torchbridge/distributed/launch_environment.h>

#include <torchbridge/parse_integer.h>

#include <c10/util/Exception.h>

#include <array>
#include <cstdlib>
#include <string>

namespace torchbridge::distributed {
namespace {

// What torchrun always sets for each worker; a run launched some other way must set them all.
constexpr std::array<const char*, 6> kRequired = {"RANK",         "WORLD_SIZE",  "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};

std::string set_and_missing(const std::function<const char*(const char*)>& lookup) {
  std::string set, missing;
  for (const char* name : kRequired) {
    std::string& list = lookup(name) != nullptr ? set : missing;
    list += list.empty() ? name : std::string(", ") + name;
  }
  return "set: " + set + "; missing: " + missing;
}

int read_int(const std::function<const char*(const char*)>& lookup, const char* name, int64_t min, int64_t max) {
  return static_cast<int>(parse_integer(lookup(name), name, min, max));
}

}  // namespace

LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup) {
  LaunchEnvironment env;
  int set = 0;
  for (const char* name : kRequired) set += lookup(name) != nullptr ? 1 : 0;
  if (set == 0) return env;  // not launched: a world of one
  TORCH_CHECK_VALUE(set == static_cast<int>(kRequired.size()),
                    "the torchrun environment is incomplete (", set_and_missing(lookup),
                    "): launch with torchrun, or set all six variables, or none for a single process");
  env.launched = true;
  env.world_size = read_int(lookup, "WORLD_SIZE", 1, 1 << 20);
  env.rank = read_int(lookup, "RANK", 0, env.world_size - 1);
  env.local_world_size = read_int(lookup, "LOCAL_WORLD_SIZE", 1, env.world_size);
  env.local_rank = read_int(lookup, "LOCAL_RANK", 0, env.local_world_size - 1);
  env.master_port = read_int(lookup, "MASTER_PORT", 1, 65535);
  env.master_addr = lookup("MASTER_ADDR");
  TORCH_CHECK_VALUE(!env.master_addr.empty(), "MASTER_ADDR is empty; expected the host name or address of rank 0");
  if (const char* restarts = lookup("TORCHELASTIC_RESTART_COUNT")) {
    env.restart_count = parse_integer(restarts, "TORCHELASTIC_RESTART_COUNT", 0);
  }
  if (const char* run_id = lookup("TORCHELASTIC_RUN_ID")) env.run_id = run_id;
  if (const char* agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string value = agent_store;
    TORCH_CHECK_VALUE(value == "True" || value == "False", "TORCHELASTIC_USE_AGENT_STORE '", value,
                      "' is not valid: expected True or False (as torchrun sets it)");
    env.agent_store = value == "True";
  }
  return env;
}

LaunchEnvironment read_launch_environment() {
  return read_launch_environment([](const char* name) { return std::getenv(name); });
}

}  // namespace torchbridge::distributed

#pragma once
// Where this process sits in a distributed run, as the launcher says: torchrun's environment
// contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and the
// TORCHELASTIC_* variables where present), or, when none of them is set, a world of one.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace torchbridge::distributed {

struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // empty for a world of one not launched by torchrun
  int master_port = 0;
  bool launched = false;    // false: none of the variables was set
  std::optional<int64_t> restart_count;  // TORCHELASTIC_RESTART_COUNT
  std::string run_id;                    // TORCHELASTIC_RUN_ID
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves the store at
  // MASTER_ADDR:MASTER_PORT, so every rank, rank 0 included, joins it as a client.
  bool agent_store = false;
};

// Reads the variables through `lookup` (a variable's value, or nullptr when unset). Some set but
// not all, a value that is not an integer, a rank outside the world, a port outside 1..65535:
// c10::ValueError naming the variable, its value and what was expected.
LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup);
// The same from this process's environment.
LaunchEnvironment read_launch_environment();

}  // namespace torchbridge::distributed

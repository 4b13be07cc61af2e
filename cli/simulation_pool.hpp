// Many simulations of one scenario, each `twin sim` in a child process: SimGrid runs one simulation per process and
// is sequential, so `twin search` and `twin sweep` fan their variants out over the cores this way.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace twin::cli {

struct SimulationOutcome {
  nlohmann::json summary;  // the child's `twin sim --json` summary, when it succeeded
  std::string error;       // otherwise the last line it wrote to stderr
  int exit_status = 0;     // the child's (2: a mistake in what it was given; -1: killed by a signal)
};

// Runs `twin sim SCENARIO --quiet --json ... EXTRA` once per list of `--set` overrides, `jobs` at a time, and
// returns the outcomes in the order of the lists. With `progress`, stderr says "[twin command] 3/8 simulated, 12 s".
std::vector<SimulationOutcome> simulate_in_children(const std::string& scenario_path,
                                                    const std::vector<std::vector<std::string>>& override_lists,
                                                    int jobs, const std::string& command,
                                                    const std::vector<std::string>& extra_arguments = {},
                                                    bool progress = true);

// What a caller of the pool hears while it runs: each outcome as it comes (its index in the lists), and a tick about
// every 20 ms (a rank of an MPI job talks to the others then).
struct PoolHooks {
  std::function<void(std::size_t index, const SimulationOutcome& outcome)> finished;
  std::function<void()> tick;
};

// simulate_in_children, calling `hooks` as it goes.
std::vector<SimulationOutcome> simulate_in_children(const std::string& scenario_path,
                                                    const std::vector<std::vector<std::string>>& override_lists,
                                                    int jobs, const std::string& command,
                                                    const std::vector<std::string>& extra_arguments, bool progress,
                                                    const PoolHooks& hooks);

// --jobs' default: the cores of this host shared among the ranks of an mpirun / srun job on it (one rank: all).
int default_jobs();

// What each child `twin sim` of a sweep or search is asked besides its plan: the whole run's length
// (`--train-tokens`, empty: not asked), its price (`--usd-per-gpu-hour`, empty: not asked; refused without a length)
// and the goodput.
std::vector<std::string> child_sim_arguments(const std::string& train_tokens, const std::string& usd_per_gpu_hour,
                                             bool goodput);

// --usd-per-gpu-hour prices a training run: refused, naming the flag, when no --train-tokens gives one.
void require_a_run_to_price(bool priced, bool train_tokens_given);

}  // namespace twin::cli

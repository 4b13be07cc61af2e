// Many simulations of one scenario, each with its own overrides: what a sweep and a search run. The caller chooses how
// (VariantSimulator): `twin` fans them out over child `twin sim` processes (cli/simulation_pool.hpp); a library
// caller simulates them here, one after another (simulate_here).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/simulation.hpp"

namespace twin::api {

struct VariantOutcome {
  nlohmann::json summary;  // sim_document of the variant, when it was simulated, without its "pipeline"
  std::string error;       // otherwise why not, one line
  int exit_status = 0;     // 2: a mistake in what it was given; 1: a failed run
};

// Simulates the scenario at `scenario_path` once per list of "key=value" overrides, each as `extras` asks (its
// training run, price and goodput), and returns the outcomes in the order of the lists.
using VariantSimulator = std::function<std::vector<VariantOutcome>(
    const std::string& scenario_path, const std::vector<std::vector<std::string>>& override_lists,
    const SimRequest& extras)>;

// One after another in this process, each replay in a forked child (SimGrid allows one simulation per process).
std::vector<VariantOutcome> simulate_here(const std::string& scenario_path,
                                          const std::vector<std::vector<std::string>>& override_lists,
                                          const SimRequest& extras);

}  // namespace twin::api

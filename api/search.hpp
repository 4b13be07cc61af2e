// A search (`twin search`): which parallel plan trains this model fastest on this cluster? The plan space of the
// scenario (model/program/plan_space.hpp) on its cluster, or on each node kind asked (holding the scenario's GPUs),
// simulated by a VariantSimulator, and ranked by iteration time (over goodput when asked). Rows and document:
// report/plan_documents.hpp.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/variants.hpp"
#include "model/program/plan_space.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::api {

struct SearchRequest {
  std::string scenario = "mtnlg-530b";  // a name under scenarios/ or a TOML file
  std::vector<std::string> sets;        // "key=value" on the scenario
  // The scenario's overrides given a node kind's extra "key=value" sets; default: `sets`, then those. A command whose
  // flags derive keys from others (Megatron-style aliases) derives them here.
  std::function<std::vector<model::Override>(const std::vector<std::string>& extra_sets)> overrides_of;
  model::PlanSpace space;
  std::vector<std::string> nodes;  // node kinds to search over (cluster.node names), the scenario's GPUs on each
  int max_plans = 48;              // simulate at most this many, smallest ideal bubble first
  bool all = false;                // simulate every plan that fits
  bool explain = false;            // keep every plan left out, with its reason
  SimRequest extras;               // each plan's training run, price, goodput (goodput also ranks)
  double within_days = 0;          // --days: each row's finishes_in_days, and the fewest GPUs that do (0: not asked)
};

// One cluster a search runs on: the scenario's, or each node kind asked.
struct SearchTarget {
  std::vector<std::string> extra_sets;  // cluster.node / gpus_per_node / nodes for a node kind
  model::Scenario base;
};

struct SearchedPlan {
  model::Plan plan;
  std::size_t target = 0;  // the SearchTarget it runs on
  VariantOutcome outcome;
  double iteration_time_s = 0, goodput_fraction = 1;
  // What ranks plans: the iteration time, over the goodput when asked (wall time per iteration of useful work).
  double effective_time_s() const { return iteration_time_s / goodput_fraction; }
};

struct Search {
  std::string scenario_path;
  std::vector<SearchTarget> targets;
  std::vector<SearchedPlan> plans;  // the ones simulated: by ideal bubble; after run_search, fastest first
  std::size_t found = 0;            // plans that fit, before the --max cut
  int rejected_for_memory = 0;
  std::vector<model::Rejection> rejections;  // with explain
};

// The targets and their plans, cut to max_plans unless `all`. Throws UserError for a scenario that cannot be
// searched; an empty `plans` when none fits (no_plan_message says so).
Search prepare_search(const SearchRequest& request);
std::string no_plan_message(const Search& search, const SearchRequest& request);
// Simulates the plans with `simulator` and ranks them.
void run_search(Search& search, const SearchRequest& request, const VariantSimulator& simulator);
// Both; throws UserError (no_plan_message) when no plan fits.
Search search(const SearchRequest& request, const VariantSimulator& simulator = simulate_here);

// Each plan's row (report::search_row_json), in rank order, and the document `twin search --json` writes.
nlohmann::json search_rows(const Search& search, const SearchRequest& request);
nlohmann::json search_document(const Search& search, const SearchRequest& request);

}  // namespace twin::api

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
#include "report/plan_documents.hpp"

namespace twin::api {

struct SearchRequest {
  std::string scenario = "mtnlg-530b";  // a name under scenarios/ or a TOML file
  std::vector<std::string> sets;        // "key=value" on the scenario
  // The scenario's overrides given a node kind's extra "key=value" sets; default: `sets`, then those. A command whose
  // flags derive keys from others (Megatron-style aliases) derives them here.
  std::function<std::vector<model::Override>(const std::vector<std::string>& extra_sets)> overrides_of;
  model::PlanSpace space;
  std::vector<std::string> nodes;  // node kinds to search over (cluster.node names), the scenario's GPUs on each
  // The rows asked for: the max_plans fastest plans, proven by a lower bound on every plan left unsimulated
  // (model/program/iteration_bound.hpp); with `all`, every plan that fits is simulated and shown.
  int max_plans = 48;
  bool all = false;
  // Plans handed to the simulator at a time once the first max_plans are: its parallelism (jobs x MPI ranks). Only the
  // speed depends on it: what a batch simulates past the point where the bound stops the search is dropped, so the
  // result is the same for any batch.
  std::size_t batch_plans = 1;
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
  model::Plan plan;        // with its iteration_time_bound_s
  std::size_t target = 0;  // the SearchTarget it runs on
  VariantOutcome outcome;
  double iteration_time_s = 0, goodput_fraction = 1;
  // What ranks plans: the iteration time, over the goodput when asked (wall time per iteration of useful work).
  double effective_time_s() const { return iteration_time_s / goodput_fraction; }
};

struct Search {
  std::string scenario_path;
  std::vector<SearchTarget> targets;
  // Before run_search: every plan that fits, by lower bound (ties by ideal bubble). After: the rows, fastest first
  // (max_plans of them unless `all`; then the simulated plans that failed).
  std::vector<SearchedPlan> plans;
  std::size_t found = 0;  // plans that fit
  int rejected_for_memory = 0;
  std::vector<model::Rejection> rejections;  // with explain
  // Where every enumerated plan went: enumerated = invalid + rejected_for_memory + pruned_by_bound + simulated.
  std::size_t enumerated = 0;
  int invalid = 0;  // broke a rule of the scenario's validation
  std::size_t pruned_by_bound = 0, simulated = 0;
};

// The targets and their plans, each with its lower bound. Throws UserError for a scenario that cannot be searched; an
// empty `plans` when none fits (no_plan_message says so).
Search prepare_search(const SearchRequest& request);
std::string no_plan_message(const Search& search, const SearchRequest& request);
// Branch and bound: simulates the plans with `simulator` in order of their lower bound until the next plan's bound
// exceeds the max_plans-th best effective time simulated (iteration time over goodput: goodput is at most 1, so the
// iteration bound bounds it too), and ranks them. A plan whose simulation failed counts for nothing. A simulator that
// returns fewer outcomes than asked (an MPI rank that failed) ends the search where it stands.
void run_search(Search& search, const SearchRequest& request, const VariantSimulator& simulator);
// Both; throws UserError (no_plan_message) when no plan fits.
Search search(const SearchRequest& request, const VariantSimulator& simulator = simulate_here);

// The lower bound a search prunes by (model/program/iteration_bound.hpp) of `scenario`'s iteration time on its
// cluster's GPUs, at the GEMM rate its simulation would use (the cluster's measured profile or measurements, else the
// cited ones).
double iteration_time_bound_s(const model::Scenario& scenario);

// Each plan's row (report::search_row_json), in rank order, and the document `twin search --json` writes.
nlohmann::json search_rows(const Search& search, const SearchRequest& request);
nlohmann::json search_document(const Search& search, const SearchRequest& request);
// Where the enumerated plans went.
report::SearchCounts search_counts(const Search& search);

}  // namespace twin::api

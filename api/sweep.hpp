// A sweep (`twin sweep`): the scenario at every combination of the values of a few keys (--vary KEY=V1,V2,...), each
// loaded and checked here first, so that a variant the scenario loader refuses shows why in its row; the rest
// simulated by a VariantSimulator. Rows and document: report/plan_documents.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/variants.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::api {

inline constexpr std::size_t kMaxSweepVariants = 256;

struct SweepRequest {
  std::string scenario = "mtnlg-530b";  // a name under scenarios/ or a TOML file
  std::vector<std::string> varies;      // "KEY=V1,V2,..."; a comma inside [...], {...} or quotes belongs to the value
  std::vector<std::string> sets;        // "key=value" on every variant
  // The overrides of one variant given its varied "key=value" sets; default: `sets`, then the variant's. A command
  // whose flags derive keys from others (Megatron-style aliases) derives them per variant here.
  std::function<std::vector<model::Override>(const std::vector<std::string>& variant_sets)> overrides_of;
  std::vector<std::string> given_keys;  // the keys the caller sets, which a --vary may not give too (default: sets')
  SimRequest extras;                    // each variant's training run, price, goodput
  double within_days = 0;               // --days: rows say finishes_in_days; the fewest GPUs that do (0: not asked)
};

// One --vary: a scenario key and the values it takes, in order.
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};

struct SweepVariant {
  std::vector<std::string> values;  // one per axis
  std::string invalid;              // why the scenario loader refused it
  std::int64_t gpus = 0;
  double tokens_per_iteration = 0;
  std::vector<std::string> sets;  // its overrides, as "key=value" (when valid)
  VariantOutcome outcome;
};

struct Sweep {
  std::string scenario_path;
  std::string model_name;
  std::vector<SweepAxis> axes;
  std::vector<SweepVariant> variants;  // every combination, the first axis slowest
  std::size_t simulated = 0;           // the valid ones
  std::string keys() const;            // "cluster.nodes x parallel.tp"
};

// The axes and variants of `request`, each variant loaded and checked. Throws UserError for a malformed --vary, and
// ScenarioError listing the problems when no variant is valid.
Sweep prepare_sweep(const SweepRequest& request);
// Simulates the valid variants with `simulator`.
void run_sweep(Sweep& sweep, const SweepRequest& request, const VariantSimulator& simulator);
// Both: the sweep with its outcomes.
Sweep sweep(const SweepRequest& request, const VariantSimulator& simulator = simulate_here);

// Each variant's row (report::sweep_row_json), in order, and the document `twin sweep --json` writes (with
// `within_days`, its fewest_gpus_within_days: the row, or null; report/within_days.hpp).
nlohmann::json sweep_rows(const Sweep& sweep, const SweepRequest& request);
nlohmann::json sweep_document(const Sweep& sweep, const SweepRequest& request);

}  // namespace twin::api

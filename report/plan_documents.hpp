// The JSON documents of `twin sweep --json` and `twin search --json`, built from each variant's or plan's simulation
// summary (the document of `twin sim --json`). The commands print their tables from the same rows.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/program/plan_space.hpp"

namespace twin::report {

// One variant of a sweep: its values of the varied keys, and its simulation's summary or why there is none.
struct SweepRow {
  std::vector<std::pair<std::string, std::string>> set;  // varied key, value
  std::int64_t gpus = 0;
  double tokens_per_iteration = 0;
  std::string error;       // "invalid: ..." (refused by the scenario checks) or "failed: ..."; empty: simulated
  nlohmann::json summary;  // the simulation's summary when simulated
};

// {set, gpus, iteration_time_s, tflops_per_gpu, bubble_fraction, memory_per_gpu_bytes, fits, tokens_per_s, error};
// when simulated also time_split, and goodput (with `goodput`) and training (with `training`).
nlohmann::json sweep_row_json(const SweepRow& row, bool goodput, bool training);
// {scenario, varied, variants}
nlohmann::json sweep_document(const std::string& model_name, const std::vector<std::string>& varied,
                              const nlohmann::json& variants);

// One plan of a search, on the node kind it was searched on, and its simulation's summary or why there is none.
struct SearchRow {
  model::Plan plan;
  std::string node;        // cluster.node
  std::int64_t nodes = 0;  // cluster.nodes
  std::string error;       // why it was not simulated; empty: simulated
  nlohmann::json summary;  // the simulation's summary when simulated
};

// The plan's columns, its memory estimate, and from the summary fits, iteration_time_s, tflops_per_gpu,
// bubble_fraction, time_split (zeros when it failed); with `training` / `goodput` those of the summary.
nlohmann::json search_row_json(const SearchRow& row, bool training, bool goodput);
// Where a search's enumerated plans went: enumerated = invalid + pruned_memory + pruned_bound + simulated, and
// that_fit = pruned_bound + simulated.
struct SearchCounts {
  std::size_t enumerated = 0, invalid = 0, pruned_memory = 0, that_fit = 0, pruned_bound = 0, simulated = 0;
};
// {scenario, plans, plans_enumerated, plans_pruned_rules, plans_pruned_memory, plans_pruned_bound, plans_simulated,
// plans_that_fit, rejected_for_memory (the same as plans_pruned_memory, its older name), memory_headroom}, and with
// `explain` rejected.
nlohmann::json search_document(const std::string& model_name, const nlohmann::json& plans, const SearchCounts& counts,
                               const std::string& memory_headroom, bool explain,
                               const std::vector<model::Rejection>& rejections);

}  // namespace twin::report

// `--days D` of sweep and search: which rows (report/plan_documents.hpp) finish their training run (--train-tokens)
// within D days, and the one that does with the fewest GPUs. The question a planner asks: "how many GPUs, and which
// plan, to train this in a month?"
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace twin::report {

// A row's training days: `days_with_failures` when the rows carry goodput (failures cost wall time), else `days`;
// nullopt for a row without a result or without a training estimate.
std::optional<double> training_days(const nlohmann::json& row);
// A row's training GPU-hours, with goodput those of the wall time failures cost too (gpu_hours / goodput_fraction).
double training_gpu_hours(const nlohmann::json& row);
// The GPUs a row trains on: its `gpus`, or tp x cp x pp x dp for a search's plan.
double row_gpus(const nlohmann::json& row);

// Sets `finishes_in_days` (true or false) on every row with training days; rows without a result get none.
void mark_finishes_in_days(nlohmann::json& rows, double days);

// The index of the row that finishes within the days with the fewest GPUs (ties: the fewest GPU-hours, failures
// counted with goodput, then the first), or nullopt when none does. Reads `finishes_in_days`.
std::optional<std::size_t> fewest_gpus_within_days(const nlohmann::json& rows);
// The fewest training days of any row (nullopt: no row has a training estimate).
std::optional<double> fastest_days(const nlohmann::json& rows);

}  // namespace twin::report

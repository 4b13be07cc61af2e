// Goodput's report, shared by `twin goodput` and `--goodput` of `twin sim`: the closed form (model/program/goodput.hpp)
// evaluated on a scenario and its iteration time, printed and as JSON.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/program/goodput.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::api {

struct GoodputReport {
  model::FailureRates rates;
  model::CheckpointCost checkpoint;
  model::GoodputInputs inputs;
  model::GoodputEstimate estimate;
  double train_days = 0;  // with --train-tokens: the run without failures, and with them (0: not asked)
  double train_days_with_failures = 0;
};

// `interval_s` 0: the optimal one; `train_tokens` 0: not asked. Throws UserError for an interval the run cannot take.
GoodputReport goodput_report(const model::Scenario& scenario, double iteration_time_s, double interval_s,
                             double train_tokens);
// The report's lines, indented as `twin sim`'s.
std::string goodput_lines(const GoodputReport& report);
// {goodput_fraction, optimal_checkpoint_interval_s, failures_per_day, training_days_with_failures (null unless
// asked), checkpoint_interval_s, young_interval_s, daly_interval_s, mtbf_s, lost_work_per_failure_s,
// downtime_per_failure_s, checkpoint_overhead_fraction, failure_loss_fraction, failures_per_day_by_component,
// checkpoint {bytes, write_s, load_s, snapshot_s, blocking_s, async, storage_gb_per_s}, restart_s}
nlohmann::json goodput_json(const GoodputReport& report);

}  // namespace twin::api

#include "exec/train/run_report.hpp"

#include <fmt/format.h>

#include "report/summary.hpp"
#include "report/trace.hpp"

namespace twin::exec {

nlohmann::json run_json(const model::Program& program, const TrainResult& result, const std::string& engine,
                        double peak_flops_per_rank) {
  nlohmann::json json;
  json["engine"] = engine;
  json["steps"] = result.steps;
  json["first_step"] = result.first_step;
  json["losses"] = result.losses;
  if (!result.aux_losses.empty()) json["aux_losses"] = result.aux_losses;
  if (!result.moe_dropped_slots.empty()) json["moe_dropped_slots"] = result.moe_dropped_slots;
  json["iteration_time_s"] = result.iteration_time_s;
  json["tokens_per_s"] = result.tokens_per_s;
  json["grad_norms"] = result.grad_norms;
  json["learning_rates"] = result.learning_rates;
  json["weight_norms"] = result.weight_norms;
  json["skipped_steps"] = result.skipped_steps;  // a skipped step's loss is NaN: null in JSON
  json["slowest_rank"] = result.slowest_ranks;    // the straggler detector's, per step
  json["lag_s"] = result.lag_s;
  json["lag_fraction"] = result.lag_fractions;
  if (!result.earlier_losses.empty()) json["earlier_losses"] = result.earlier_losses;
  if (!result.resumed_from.empty()) {
    json["resumed_from"] = result.resumed_from;
    json["resharded"] = result.resharded;
  }
  if (!result.last_checkpoint.empty()) json["last_checkpoint"] = result.last_checkpoint;
  if (result.timeline) {
    const report::Summary summary = report::summarize(program, *result.timeline, peak_flops_per_rank, engine);
    json["summary"] = report::summary_to_json(summary);
    json["summary"]["traced_step"] = result.traced_step;
  }
  return json;
}

std::string compute_by_kernel_note(const model::Program& program, const TrainResult& result) {
  if (!result.timeline) return {};
  const report::Summary summary = report::summarize(program, *result.timeline, 0, "exec");
  return fmt::format("step {}: compute by kernel: {}", result.traced_step + 1, report::compute_by_kernel_line(summary));
}

std::string run_trace(const model::Program& program, const TrainResult& result) {
  if (!result.timeline) return {};
  return report::chrome_trace(program, *result.timeline);
}

}  // namespace twin::exec

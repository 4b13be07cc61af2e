// Goodput's report: the scenario's failure model and checkpoint, evaluated at an iteration time.
#include "api/goodput_report.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "model/scenario/errors.hpp"
#include "topology/hardware.hpp"

namespace twin::api {
namespace {

// One GPU's link to host memory; a cpu-host's state is in host memory already (no snapshot to take).
double host_copy_bytes_per_s(const model::Scenario& scenario) {
  try {
    return topology::host_link_bytes_per_s(topology::node_spec(scenario.cluster).gpu);
  } catch (const std::invalid_argument&) {
    return std::numeric_limits<double>::infinity();
  }
}

std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return "never";
  if (seconds >= 86400) return fmt::format("{:.2f} days", seconds / 86400);
  if (seconds >= 3600) return fmt::format("{:.2f} h", seconds / 3600);
  if (seconds >= 60) return fmt::format("{:.1f} min", seconds / 60);
  return fmt::format("{:.1f} s", seconds);
}

nlohmann::json finite_or_null(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nullptr;
}

}  // namespace

GoodputReport goodput_report(const model::Scenario& scenario, double iteration_time_s, double interval_s,
                             double train_tokens) {
  GoodputReport r;
  r.rates = model::failure_rates(scenario);
  r.checkpoint = model::checkpoint_cost(scenario, host_copy_bytes_per_s(scenario));
  r.inputs = model::goodput_inputs(scenario, iteration_time_s, r.checkpoint);
  r.inputs.interval_s = interval_s;
  try {
    r.estimate = model::goodput_closed_form(r.inputs);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("--checkpoint-interval: {}", error.what()));
  }
  if (train_tokens > 0) {
    const double tokens_per_iteration = static_cast<double>(scenario.parallel.global_batch * scenario.model.seq_len);
    r.train_days = std::ceil(train_tokens / tokens_per_iteration) * iteration_time_s / 86400;
    r.train_days_with_failures = r.train_days / r.estimate.goodput_fraction;
  }
  return r;
}

std::string goodput_lines(const GoodputReport& r) {
  const model::GoodputEstimate& e = r.estimate;
  const double per_day = 86400 * r.inputs.gpus / 3600;  // failures per day per unit of per-GPU-hour rate
  std::string out = fmt::format(
      "  interruptions per day     {:8.2f}     (GPU {:.2f}, host {:.2f}, NIC {:.2f}, switch {:.2f}, software {:.2f}; "
      "mean time between them {})\n",
      e.failures_per_day, r.rates.gpu * per_day, r.rates.host * per_day, r.rates.nic * per_day,
      r.rates.network * per_day, r.rates.software * per_day, duration(e.mtbf_s));
  out += fmt::format(
      "  checkpoint                {:8.1f} GB   (write {}, load {} at {:.0f} GB/s; {}: training waits {} each)\n",
      r.checkpoint.bytes / 1e9, duration(r.checkpoint.write_s), duration(r.checkpoint.load_s),
      r.checkpoint.storage_bytes_per_s / 1e9, r.checkpoint.async ? "asynchronous" : "blocking",
      duration(r.checkpoint.blocking_s()));
  if (e.failures_per_day > 0) {
    out += fmt::format("  checkpoint interval       {:>8}     ({}; optimal {}, Young sqrt(2 C M) {}, Daly {})\n",
                       duration(e.interval_s), r.inputs.interval_s > 0 ? "given" : "the optimal one",
                       duration(e.optimal_interval_s), duration(e.young_interval_s), duration(e.daly_interval_s));
    out += fmt::format("  per interruption          {:>8}     of work lost, and {} to restart and load\n",
                       duration(e.lost_work_per_failure_s), duration(e.downtime_per_failure_s));
  }
  out += fmt::format(
      "  goodput                   {:8.1f} %   (useful training time over wall time: {:.1f} % checkpoints, {:.1f} % "
      "failures)\n",
      100 * e.goodput_fraction, 100 * e.checkpoint_overhead_fraction, 100 * e.failure_loss_fraction);
  if (r.train_days > 0) {
    out += fmt::format("  training days             {:8.1f}     with failures ({:.1f} without)\n",
                       r.train_days_with_failures, r.train_days);
  }
  return out;
}

nlohmann::json goodput_json(const GoodputReport& r) {
  const model::GoodputEstimate& e = r.estimate;
  const double per_day = 86400 * r.inputs.gpus / 3600;
  return {{"goodput_fraction", e.goodput_fraction},
          {"optimal_checkpoint_interval_s", e.optimal_interval_s},
          {"failures_per_day", e.failures_per_day},
          {"training_days_with_failures",
           r.train_days > 0 ? nlohmann::json(r.train_days_with_failures) : nlohmann::json(nullptr)},
          {"checkpoint_interval_s", e.interval_s},
          {"young_interval_s", e.young_interval_s},
          {"daly_interval_s", e.daly_interval_s},
          {"mtbf_s", finite_or_null(e.mtbf_s)},
          {"lost_work_per_failure_s", e.lost_work_per_failure_s},
          {"downtime_per_failure_s", e.downtime_per_failure_s},
          {"checkpoint_overhead_fraction", e.checkpoint_overhead_fraction},
          {"failure_loss_fraction", e.failure_loss_fraction},
          {"failures_per_day_by_component",
           {{"gpu", r.rates.gpu * per_day},
            {"host", r.rates.host * per_day},
            {"nic", r.rates.nic * per_day},
            {"switch", r.rates.network * per_day},
            {"software", r.rates.software * per_day}}},
          {"checkpoint",
           {{"bytes", r.checkpoint.bytes},
            {"write_s", r.checkpoint.write_s},
            {"load_s", r.checkpoint.load_s},
            {"snapshot_s", r.checkpoint.snapshot_s},
            {"blocking_s", r.checkpoint.blocking_s()},
            {"async", r.checkpoint.async},
            {"storage_gb_per_s", r.checkpoint.storage_bytes_per_s / 1e9}}},
          {"restart_s", r.inputs.restart_s - r.checkpoint.load_s},
          {"iteration_time_s", r.inputs.iteration_time_s}};
}

}  // namespace twin::api

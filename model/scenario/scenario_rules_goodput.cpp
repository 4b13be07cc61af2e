// The reliability keys' rules: interruption rates, the checkpoint storage's rate and the restart time that
// `twin goodput` reads (model/program/goodput.hpp), and the price of a GPU-hour that a training run's cost reads. Each
// is optional; a given one must be a number of its unit.
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "model/scenario/scenario.hpp"
#include "model/scenario/scenario_rules.hpp"

namespace twin::model {

void check_failure_model(const Scenario& scenario, std::vector<std::string>& problems) {
  for (const auto& [key, field] : failure_model_fields(scenario.cluster)) {
    if (!field->has_value()) continue;
    const double value = **field;
    const std::string_view name = key;
    // A rate per GPU-hour: Llama 3's whole fleet gave 2e-5 (model/program/goodput.cpp); 0.01 would fail every GPU
    // every 100 hours, a rate per job-hour or per day typed in the wrong key.
    if (name.ends_with("_per_gpu_hour") && !(value >= 0 && value <= 0.01)) {
      problems.push_back(
          fmt::format("{}: cluster.{} must be interruptions per GPU-hour (0..0.01; Llama 3's fleet: "
                      "about 2e-5 for every cause together), got {}",
                      scenario.source, key, value));
    }
    if (name == "storage_gb_per_s" && !(value >= 0.001 && value <= 1e6)) {
      problems.push_back(fmt::format(
          "{}: cluster.storage_gb_per_s must be the checkpoint storage's write rate for the job in GB/s (0.001..1e6), "
          "got {}",
          scenario.source, value));
    }
    if (name == "restart_s" && !(value >= 0 && value <= 1e6)) {
      problems.push_back(fmt::format(
          "{}: cluster.restart_s must be the seconds from an interruption to training again (0..1e6), got {}",
          scenario.source, value));
    }
  }
  // Dollars per GPU-hour: public clouds list H100s at a few dollars; above 1000 it is cents, or a node's or a month's
  // price typed in the per-GPU-hour key.
  const double price = scenario.cluster.usd_per_gpu_hour;
  if (!(price >= 0 && price <= 1000)) {
    problems.push_back(fmt::format("{}: cluster.usd_per_gpu_hour must be US dollars per GPU-hour (0..1000; 0: not "
                                   "given), got {}",
                                   scenario.source, price));
  }
}

}  // namespace twin::model

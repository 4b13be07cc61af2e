// twin sweep SCENARIO --vary KEY=V1,V2,...: how does the prediction move with a key (or a few)?
// Every combination of the --vary values is the scenario with those overrides on top of --set. Each is loaded and
// checked first (api/sweep.hpp), so a variant the scenario loader refuses shows why in its row; the rest are simulated
// with `twin sim` in child processes, --jobs at a time, and printed in the order of the combinations.
#include <algorithm>
#include <cstdio>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "api/sweep.hpp"
#include "cli/commands.hpp"
#include "cli/simulation_pool.hpp"
#include "cli/simulation_ranks.hpp"
#include "cli/within_days.hpp"
#include "report/plan_tables.hpp"

namespace twin::cli {
namespace {

struct SweepOptions {
  ScenarioOptions scenario;
  std::vector<std::string> varies;
  int jobs = 0;  // 0: hardware threads
  std::string json_path;
  std::string csv_path;  // --csv: the table, a line per variant
  std::string train_tokens;  // passed on to each `twin sim --train-tokens` (empty: not asked)
  std::string usd_per_gpu_hour;  // passed on to each `twin sim --usd-per-gpu-hour` (empty: not asked)
  bool goodput = false;      // --goodput: each variant's goodput, and the one with most useful tokens per second
  double days = 0;           // --days: which variants finish in time, and the fewest GPUs that do (0: not asked)
  bool quiet = false;        // nothing on stderr but errors
};

// The library's request: the variant's keys that Megatron-style flags derive follow the variant
// (--num-layers-per-virtual-pipeline-stage under a varied parallel.pp).
api::SweepRequest sweep_request(const SweepOptions& o) {
  api::SweepRequest request;
  request.scenario = o.scenario.scenario;
  request.varies = o.varies;
  request.sets = o.scenario.sets;
  for (const auto& alias : o.scenario.aliases) request.given_keys.push_back(alias.key);
  request.overrides_of = [options = o.scenario](const std::vector<std::string>& variant_sets) {
    ScenarioOptions variant = options;
    variant.sets.insert(variant.sets.end(), variant_sets.begin(), variant_sets.end());
    return scenario_overrides(variant);
  };
  request.extras.train_tokens = o.train_tokens;
  request.extras.goodput = o.goodput;
  request.within_days = o.days;
  return request;
}

// The variants' table, from their rows; with --goodput, the variant with the most useful tokens per second.
void print_sweep(const api::Sweep& sweep, const nlohmann::json& rows, const SweepOptions& o) {
  fmt::print("{}: {} variants of {}\n\n", sweep.model_name, sweep.variants.size(), sweep.keys());
  std::vector<std::size_t> widths;
  std::string header = " ";
  for (const api::SweepAxis& axis : sweep.axes) {
    std::size_t width = axis.key.size();
    for (const std::string& value : axis.values) width = std::max(width, value.size());
    widths.push_back(width);
    header += fmt::format(" {:>{}}", axis.key, width);
  }
  const bool training = !o.train_tokens.empty();
  fmt::print("{} {:>6} {:>10} {:>9} {:>8} {:>9} {:>5} {:>12}{}\n", header, "GPUs", "iter s", "TFLOP/s", "bubble",
             "mem GiB", "fits", "tokens/s",
             fmt::format("{}{}{}", o.goodput ? fmt::format(" {:>8} {:>12}", "goodput", "useful tok/s") : "",
                         training ? fmt::format(" {:>9} {:>12}", "days", "GPU-hours") : "",
                         o.days > 0 ? fmt::format(" {:>8}", "finishes") : ""));
  std::string best_row;  // --goodput: the variant with the most useful tokens per second
  double best_useful_tokens_per_s = 0;
  for (std::size_t i = 0; i < sweep.variants.size(); ++i) {
    const nlohmann::json& entry = rows[i];
    std::string row = " ";
    for (std::size_t a = 0; a < sweep.axes.size(); ++a) row += fmt::format(" {:>{}}", sweep.variants[i].values[a], widths[a]);
    const std::string error = entry.at("error").get<std::string>();
    if (!error.empty()) {
      fmt::print("{}  {}\n", row, error);
      continue;
    }
    std::string training_columns;
    double goodput = 1;
    if (o.goodput) {
      goodput = entry.at("goodput").at("goodput_fraction").get<double>();
      const double useful = entry["tokens_per_s"].get<double>() * goodput;
      training_columns = fmt::format(" {:>7.1f}% {:>12.0f}", 100 * goodput, useful);
      if (useful > best_useful_tokens_per_s) best_useful_tokens_per_s = useful, best_row = row;
    }
    if (training) {
      // With --goodput the days count failures (and the GPU-hours the wall time they cost).
      const double days = entry.at("training").value(o.goodput ? "days_with_failures" : "days", 0.0);
      training_columns += fmt::format(" {:>9.1f} {:>12.0f}", days,
                                      entry.at("training").at("gpu_hours").get<double>() / goodput);
    }
    if (o.days > 0) training_columns += fmt::format(" {:>8}", finishes_cell(entry));
    fmt::print("{} {:>6} {:>10.3f} {:>9.1f} {:>7.1f}% {:>9.1f} {:>5} {:>12.0f}{}\n", row, sweep.variants[i].gpus,
               entry["iteration_time_s"].get<double>(), entry["tflops_per_gpu"].get<double>(),
               100 * entry["bubble_fraction"].get<double>(),
               entry["memory_per_gpu_bytes"].get<double>() / (1024.0 * 1024 * 1024),
               entry["fits"].get<bool>() ? "yes" : "NO", entry["tokens_per_s"].get<double>(), training_columns);
  }
  if (o.goodput && !best_row.empty()) {
    fmt::print("\n  most useful tokens per second, failures counted:{} ({:.0f})\n", best_row,
               best_useful_tokens_per_s);
  }
  if (o.days > 0) {
    print_within_days(rows, o.days, [](const nlohmann::json& row) {
      std::string values;
      for (const auto& [key, value] : row.at("set").items()) {
        values += fmt::format("{}{}={}", values.empty() ? "" : " ", key, value.get<std::string>());
      }
      return values;
    });
  }
}

void run_sweep(const SweepOptions& o) {
  const api::SweepRequest request = sweep_request(o);
  api::check_within_days(request.within_days, request.extras);
  require_outputs_before_work({{"--json", o.json_path}, {"--csv", o.csv_path}},
                              {{"the scenario", resolve_scenario_path(o.scenario.scenario)}});
  api::Sweep sweep = api::prepare_sweep(request);
  const int jobs = o.jobs > 0 ? o.jobs : default_jobs();
  const bool quiet = o.quiet || launched_rank().rank != 0;  // under mpirun / srun rank 0 speaks for all
  if (!quiet) {
    fmt::print(stderr,
               "twin sweep: {} variants of {} ({} refused by the scenario checks); simulating {} with {} jobs\n",
               sweep.variants.size(), sweep.keys(), sweep.variants.size() - sweep.simulated, sweep.simulated, jobs);
  }
  const std::vector<std::string> extra = child_sim_arguments(o.train_tokens, o.usd_per_gpu_hour, o.goodput);
  bool follower = false;  // a rank other than 0 of an MPI job: rank 0 prints and writes for it
  api::run_sweep(sweep, request, ranks_simulator(jobs, "sweep", extra, !quiet, follower));
  if (follower) return;
  const nlohmann::json rows = api::sweep_rows(sweep, request);
  print_sweep(sweep, rows, o);
  if (!o.json_path.empty()) {
    write_file_atomically(o.json_path, api::sweep_document(sweep, request).dump(1) + "\n");
  }
  if (!o.csv_path.empty()) {
    std::vector<std::string> varied;
    for (const api::SweepAxis& axis : sweep.axes) varied.push_back(axis.key);
    write_file_atomically(o.csv_path, report::csv(report::sweep_columns(varied, rows), rows));
  }
  end_job_if_a_rank_died();
  std::size_t succeeded = 0;
  for (const nlohmann::json& row : rows) succeeded += row.at("error").get<std::string>().empty() ? 1 : 0;
  if (succeeded == 0) {
    // Every simulation refused what it was given (exit 2), or some failed: a mistake typed, or a failed run.
    bool mistakes = true;
    for (const api::SweepVariant& v : sweep.variants) mistakes &= !v.invalid.empty() || v.outcome.exit_status == 2;
    fmt::print(stderr, "twin: error: no variant could be simulated (each row says why)\n");
    throw CLI::RuntimeError(mistakes ? 2 : 1);
  }
}

}  // namespace

void register_sweep_command(CLI::App& app) {
  auto o = std::make_shared<SweepOptions>();
  CLI::App* command = app.add_subcommand(
      "sweep", "simulate the scenario at each value of one or more keys (--vary cluster.nodes=280,350,420)");
  add_scenario_options(*command, o->scenario);
  command
      ->add_option("--vary", o->varies,
                   "a key and its values, KEY=V1,V2,... (repeatable: every combination is simulated)")
      ->type_name("KEY=V1,V2,...")
      ->required();
  command
      ->add_option("--jobs", o->jobs,
                   "simulations at a time on each host (default: one per core, shared among the MPI ranks on it)")
      ->check(between(1, 1024));
  command->add_option("--json", o->json_path, "write every variant and its result as JSON")->check(output_file());
  command->add_option("--csv", o->csv_path, "write the table as CSV, a line per variant")->check(output_file());
  command
      ->add_option("--usd-per-gpu-hour", o->usd_per_gpu_hour,
                   "with --train-tokens: each plan's GPU-hours priced at this many dollars per GPU-hour (JSON "
                   "training.cost_usd)")
      ->check(between(0.001, 1000));
  command
      ->add_option("--train-tokens", o->train_tokens,
                   "also estimate each variant's whole training run of this many tokens: days, GPU-hours")
      ->check(token_count("--train-tokens"));
  add_days_option(*command, o->days, "variant");
  command->add_flag("--goodput", o->goodput,
                    "each variant's goodput by the scenario's failure model (twin goodput), its useful tokens per "
                    "second, --train-tokens days with failures, and the variant with the most useful tokens per "
                    "second");
  command->add_flag("--quiet", o->quiet, "no progress on stderr (errors still)");
  command->callback([o] { run_sweep(*o); });
}

}  // namespace twin::cli

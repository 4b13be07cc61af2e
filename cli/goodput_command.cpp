// twin goodput SCENARIO: what a run delivers per wall-clock day once interruptions, checkpoints and restarts count.
//   twin goodput llama3-405b-meta --set cluster.nodes=2048 --train-tokens 15.6T
//   twin goodput gpt3-175b --iteration-time 31.8 --monte-carlo 1000 --seed 1 --json goodput.json
// The iteration time comes from `twin sim` (a child process, as search and sweep run theirs) unless given; the math
// is model/program/goodput.hpp's, the report api/goodput_report.cpp's.
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "api/goodput_report.hpp"
#include "cli/simulation_pool.hpp"

namespace twin::cli {
namespace {

struct GoodputOptions {
  ScenarioOptions scenario;
  double iteration_time_s = 0;  // --iteration-time: in place of a simulation (0: simulate)
  double interval_s = 0;        // --checkpoint-interval (0: the optimal one)
  std::string train_tokens;
  int monte_carlo_trials = 0;  // --monte-carlo N (0: the closed form alone)
  std::uint64_t seed = 1;
  std::string json_path;
  bool quiet = false;
};

double simulated_iteration_time_s(const GoodputOptions& o) {
  const std::string path = resolve_scenario_path(o.scenario.scenario);
  const std::vector<SimulationOutcome> outcomes =
      simulate_in_children(path, {as_sets(scenario_overrides(o.scenario))}, 1, "goodput", {}, !o.quiet);
  const SimulationOutcome& outcome = outcomes.front();
  if (!outcome.error.empty()) {
    const std::string prefix = "twin: error: ";
    const std::string message =
        outcome.error.rfind(prefix, 0) == 0 ? outcome.error.substr(prefix.size()) : outcome.error;
    if (outcome.exit_status == 2) throw UserError(message);
    throw std::runtime_error("twin goodput: the simulation failed: " + message);
  }
  return outcome.summary.at("iteration_time_s").get<double>();
}

void run(const GoodputOptions& o) {
  const model::Scenario scenario = load_scenario(o.scenario);
  const double tokens = o.train_tokens.empty() ? 0 : parse_token_count("--train-tokens", o.train_tokens);
  const bool simulated = o.iteration_time_s <= 0;
  const double iteration_time_s = simulated ? simulated_iteration_time_s(o) : o.iteration_time_s;
  const api::GoodputReport report = api::goodput_report(scenario, iteration_time_s, o.interval_s, tokens);

  fmt::print("{}: {} GPUs, iteration {:.3f} s ({})\n\n", scenario.model.name, scenario.cluster.total_gpus(),
             iteration_time_s, simulated ? "simulated" : "--iteration-time");
  fmt::print("{}", api::goodput_lines(report));
  nlohmann::json json = api::goodput_json(report);
  if (o.monte_carlo_trials > 0) {
    // The whole run when its length is asked, else 30 days of training: each trial one such run.
    const double useful_s = report.train_days > 0 ? report.train_days * 86400 : 30 * 86400.0;
    model::MonteCarloGoodput mc;
    try {
      mc = model::goodput_monte_carlo(report.inputs, useful_s, o.monte_carlo_trials, o.seed);
    } catch (const std::invalid_argument& error) {
      throw UserError(fmt::format("--monte-carlo: {}", error.what()));
    }
    fmt::print(
        "\n  Monte Carlo, {} runs of {:.1f} training days (seed {}): goodput {:.2f} % +- {:.2f} % (95 %), "
        "closed form {:.2f} %; {:.1f} interruptions a run; wall time {:.1f} days (5 % to 95 %: {:.1f} to {:.1f})\n",
        mc.trials, useful_s / 86400, o.seed, 100 * mc.goodput_fraction, 100 * mc.confidence95,
        100 * report.estimate.goodput_fraction, mc.failures_mean, mc.wall_s_mean / 86400, mc.wall_s_p05 / 86400,
        mc.wall_s_p95 / 86400);
    json["monte_carlo"] = {{"trials", mc.trials},
                           {"seed", o.seed},
                           {"training_days", useful_s / 86400},
                           {"goodput_fraction", mc.goodput_fraction},
                           {"confidence95", mc.confidence95},
                           {"failures_mean", mc.failures_mean},
                           {"wall_days_mean", mc.wall_s_mean / 86400},
                           {"wall_days_stddev", mc.wall_s_stddev / 86400},
                           {"wall_days_p05", mc.wall_s_p05 / 86400},
                           {"wall_days_p95", mc.wall_s_p95 / 86400}};
  }
  fmt::print(
      "\n  failure model: interruptions per GPU-hour by component (cluster.*_failures_per_gpu_hour; default Llama 3's "
      "fleet, arXiv:2407.21783 Table 5), restart {:.0f} s (cluster.restart_s), storage cluster.storage_gb_per_s; "
      "docs/goodput.md\n",
      report.inputs.restart_s - report.checkpoint.load_s);
  if (!o.json_path.empty()) {
    json["scenario"] = scenario.model.name;
    json["gpus"] = scenario.cluster.total_gpus();
    write_file_atomically(o.json_path, json.dump(2) + "\n");
    fmt::print("  written to {}\n", o.json_path);
  }
}

}  // namespace

void register_goodput_command(CLI::App& app) {
  auto o = std::make_shared<GoodputOptions>();
  CLI::App* command = app.add_subcommand(
      "goodput", "useful training time per wall time with interruptions, checkpoints and restarts (Young/Daly)");
  add_scenario_options(*command, o->scenario);
  command
      ->add_option("--iteration-time", o->iteration_time_s,
                   "seconds per iteration, in place of simulating the scenario (a measured one, say)")
      ->check(between(1e-6, 1e6));
  command
      ->add_option("--checkpoint-interval", o->interval_s,
                   "seconds of training between checkpoints (default: the optimal one)")
      ->check(between(1e-6, 1e9));
  command
      ->add_option("--train-tokens", o->train_tokens,
                   "the whole run of this many tokens (300B, 15.6T): its days with failures counted")
      ->check(token_count("--train-tokens"));
  command
      ->add_option("--monte-carlo", o->monte_carlo_trials,
                   "also draw this many runs of the same process (seeded): the mean and spread beside the closed form")
      ->check(between(2, 1e6));
  command->add_option("--seed", o->seed, "the Monte Carlo's seed (default 1)");
  command->add_option("--json", o->json_path, "write the report as JSON")->check(output_file());
  command->add_flag("--quiet", o->quiet, "no progress line");
  command->callback([o] { run(*o); });
}

}  // namespace twin::cli

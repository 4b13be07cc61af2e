// Simulator speed: MT-NLG 530B on 35, 140, 280, 420 and 560 DGX A100 nodes at each fidelity. Reports the simulated
// iteration, the wall time, the peak memory of the simulating process and SimGrid activities per second. Each case
// runs in its own process; a case over the time budget is stopped and noted.
//
//   twin_sim_bench [--budget SECONDS] [--nodes 35,140,280,420,560] [--fidelity group|rank|both] [--scenario FILE]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace {

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) values.push_back(std::stoi(item));
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  double budget_s = 300;
  std::vector<int> node_counts = {35, 140, 280, 420, 560};
  std::string fidelities = "both";
  std::string scenario_path = std::string(TWIN_SCENARIO_DIR) + "/mtnlg-530b.toml";
  const auto usage = [&argv](std::FILE* out) {
    fmt::print(out,
               "usage: {} [--budget S] [--nodes 35,140] [--fidelity group|rank|both] [--scenario FILE]\n"
               "  default: both fidelities (rank fidelity takes minutes per case) on 35..560 nodes, 300 s each\n",
               argv[0]);
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fmt::print(stderr, "{}: {} needs a value\n", argv[0], flag);
      usage(stderr);
      return 2;
    }
    const std::string value = argv[i + 1];
    try {
      if (flag == "--budget")
        budget_s = std::stod(value);
      else if (flag == "--nodes")
        node_counts = parse_list(value);
      else if (flag == "--fidelity" && (value == "group" || value == "rank" || value == "both"))
        fidelities = value;
      else if (flag == "--scenario")
        scenario_path = value;
      else {
        fmt::print(stderr, "{}: unknown flag or value: {} {}\n", argv[0], flag, value);
        usage(stderr);
        return 2;
      }
    } catch (const std::exception&) {
      fmt::print(stderr, "{}: {} takes a number (a list of them for --nodes), got '{}'\n", argv[0], flag, value);
      return 2;
    }
  }
  std::vector<twin::sim::Fidelity> runs;
  if (fidelities != "rank") runs.push_back(twin::sim::Fidelity::Group);
  if (fidelities != "group") runs.push_back(twin::sim::Fidelity::Rank);

  fmt::print("twin sim bench: {} , budget {:.0f} s per case\n\n", scenario_path, budget_s);
  fmt::print("{:>6} {:>6} {:>9} {:>7} {:>11} {:>8} {:>9} {:>9} {:>12} {:>13} {:>11}\n", "nodes", "GPUs", "fidelity",
             "actors", "iteration s", "TFLOP/s", "wall s", "RSS MB", "activities", "activities/s", "rank-ops/s");
  for (const int nodes : node_counts) {
    const twin::model::Scenario scenario =
        twin::model::load_scenario(scenario_path, {{"cluster.nodes", std::to_string(nodes)}});
    const twin::model::Program program = twin::model::build_program(scenario, twin::model::Granularity::Layer);
    const twin::sim::AnalyticalCostModel cost(twin::topology::node_spec(scenario.cluster.node).gpu);
    for (const twin::sim::Fidelity fidelity : runs) {
      twin::sim::SimOptions options;
      options.fidelity = fidelity;
      options.wall_limit_s = budget_s;
      try {
        const twin::sim::SimResult result = twin::sim::simulate(program, cost, options);
        const auto& s = result.stats;
        const double T = result.timeline.iteration_time_s;
        const double tflops =
            twin::model::reported_flops_per_iteration(scenario) / (T * scenario.cluster.total_gpus()) / 1e12;
        fmt::print("{:>6} {:>6} {:>9} {:>7} {:>11.3f} {:>8.1f} {:>9.2f} {:>9.0f} {:>12} {:>13.0f} {:>11.0f}\n", nodes,
                   scenario.cluster.total_gpus(), twin::sim::to_string(result.fidelity), s.actors, T, tflops, s.wall_s,
                   s.peak_rss_bytes / 1e6, s.activities, static_cast<double>(s.activities) / s.wall_s,
                   static_cast<double>(s.rank_ops) / s.wall_s);
      } catch (const twin::sim::SimulationError& error) {
        fmt::print("{:>6} {:>6} {:>9}   skipped: {}\n", nodes, scenario.cluster.total_gpus(),
                   twin::sim::to_string(fidelity), error.what());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

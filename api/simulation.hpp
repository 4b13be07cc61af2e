// One simulated iteration, as `twin sim` runs it and a binding calls it: a scenario and what is asked of its
// simulation (SimRequest, the flags of `twin sim`) in; the Program, the simulator's result, its summary and the
// extras asked for (band, training run, goodput, sensitivities, degraded parts) out, and the JSON document
// `twin sim --json` writes (sim_document).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/band.hpp"
#include "api/goodput_report.hpp"
#include "api/measured_hardware.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "report/summary.hpp"
#include "sim/cost_model.hpp"
#include "sim/sensitivity.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"

namespace twin::api {

// What is asked of a simulation: `twin sim`'s flags, by their names (errors name the flags).
struct SimRequest {
  std::string fidelity = "auto";      // auto, rank or group
  std::string granularity = "layer";  // layer or op
  std::string gpu;                    // a what-if GPU: a100, h100 or h200 (empty: the scenario's)
  std::string profile;                // a measured profile (twin calibrate), in place of cluster.gpu_profile
  std::string placement = "tp-dp-pp";
  std::string algorithm = "auto";
  double oversubscription = 1.0;
  bool rail_optimized = false;
  bool ideal_network = false;
  std::string trace_ranks;         // ranks whose timelines are kept (a Chrome trace's)
  bool trace = false;              // a trace will be written: its size is checked before simulating
  bool large_trace = false;        // a trace past kLargeTraceBytes is allowed
  bool progress = false;           // progress and notices on stderr
  double sensitivity_percent = 0;  // each rate this much lower and higher (0: not asked)
  std::string train_tokens;        // the whole run's length, "300B" (empty: not asked)
  double usd_per_gpu_hour = 0;     // the run's GPU-hours priced (0: not asked; needs train_tokens)
  bool goodput = false;            // the scenario's failure model at this iteration time
  std::vector<std::string> slow_gpus, slow_links, failed_uplinks;  // sim/degraded.hpp, as typed
  double slow_gpu_fraction = 0, slow_gpu_factor = 1.5;
  std::uint64_t seed = 1;
  // SimGrid runs one simulation per process: a library runs each in a forked child (sim::SimOptions::isolate). The
  // `twin sim` command, which simulates once, runs it in its own process.
  bool isolate = true;
};

// A whole training run at the simulated iteration time: what a planner buys. Every iteration at the full global
// batch (no batch-size ramp-up), no evaluation, checkpoints or restarts.
struct TrainingEstimate {
  double tokens = 0, tokens_per_iteration = 0, iterations = 0, time_s = 0, gpu_hours = 0;
  double usd_per_gpu_hour = 0;  // the price its cost is at: --usd-per-gpu-hour, else cluster.usd_per_gpu_hour (0: none)
};

struct Simulation {
  model::Program program;
  sim::SimOptions options;
  topology::NodeSpec node;             // the node simulated
  MeasuredHardware measured_hardware;  // a profile's measurements, if any
  bool host_profile = false;           // a cpu-host's profile describes the whole node
  bool same_gpu = true;                // the scenario's own GPU (no --gpu what-if on another)
  bool measured = false;               // the cluster gives its own GPU measurements
  sim::AnalyticalParameters parameters;
  std::string cost_model;  // the cost model's name
  sim::SimResult result;
  std::optional<report::Timeline> healthy;  // with degradations: the same run without them
  report::Summary summary;
  PredictionBand band;
  std::optional<TrainingEstimate> training;
  std::optional<GoodputReport> goodput;
  std::vector<sim::RateSensitivity> sensitivities;
  std::vector<std::string> notes;  // what the user set that the prediction does not show
  std::vector<int> traced_ranks;   // the ranks a trace shows (empty: one per stage)
};

// Simulates `scenario` as `request` asks. Throws UserError (a ScenarioError, a SimulationError) naming the field or
// flag for what was given wrong.
Simulation simulate(const model::Scenario& scenario, const SimRequest& request);

// The JSON document `twin sim --json` writes.
nlohmann::json sim_document(const Simulation& simulation, const SimRequest& request);

// --days D of a sweep or search (their within_days; 0: not asked) asks whether a training run finishes in time: throws
// UserError naming --days at D below 0 or not finite, or without the run's length (`extras.train_tokens`).
void check_within_days(double days, const SimRequest& extras);

// The human-readable lines of the prediction's provenance: the GPU constants (or the profile), the framework, notes.
std::string gpu_constants_line(const sim::AnalyticalParameters& p, const topology::GpuSpec& gpu, bool from_profile);
std::string framework_line(const model::Scenario& s);

// 3.15e6 -> "3.15 M": the scale a person reads counts of tokens and hours in.
std::string with_scale(double value);

}  // namespace twin::api

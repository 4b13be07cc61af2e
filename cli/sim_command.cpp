// twin sim SCENARIO: simulate one training iteration on a SimGrid model of the cluster and report it.
//   twin sim                                   MT-NLG 530B on 280 DGX A100 nodes
//   twin sim mtnlg-530b --nodes 420 --json out.json --svg pipeline.svg --trace trace.json --trace-ranks 0-7
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cli/band.hpp"
#include "cli/commands.hpp"
#include "cli/goodput_report.hpp"
#include "cli/measured_hardware.hpp"
#include "cli/simulation_pool.hpp"
#include "model/ops/expert_load.hpp"
#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "report/svg.hpp"
#include "report/trace.hpp"
#include "sim/cost_model.hpp"
#include "sim/sensitivity.hpp"
#include "sim/simulate.hpp"
#include "topology/hardware.hpp"
#include "topology/platform.hpp"

namespace twin::cli {
namespace {

struct SimCommandOptions {
  ScenarioOptions scenario;
  std::string fidelity = "auto";
  std::string granularity = "layer";
  std::string gpu;
  std::string profile;  // --profile: a cpu-host's measured rates (twin calibrate)
  std::string placement = "tp-dp-pp";
  std::string algorithm = "auto";
  double oversubscription = 1.0;
  bool rail_optimized = false;
  bool ideal_network = false;
  std::string json_path, trace_path, trace_ranks, svg_path;
  bool large_trace = false;  // --large-trace: write a trace past kLargeTraceBytes
  bool quiet = false;
  double sensitivity_percent = 0;  // --sensitivity: each rate this much lower and higher (0: not asked)
  std::string train_tokens;        // --train-tokens: the whole run's length (empty: not asked)
  double usd_per_gpu_hour = 0;     // --usd-per-gpu-hour: the run's GPU-hours priced (0: not asked)
  bool goodput = false;            // --goodput: the scenario's failure model at this iteration time
  // Stragglers and degraded parts (sim/degraded.hpp): each as typed, checked at parse time.
  std::vector<std::string> slow_gpus, slow_links, failed_uplinks;
  double slow_gpu_fraction = 0, slow_gpu_factor = 1.5;
  std::uint64_t seed = 1;
};

// The --slow-gpu, --slow-gpu-fraction, --slow-link and --failed-uplink what-ifs, parsed (UserError naming the flag).
sim::Degradations degradations(const SimCommandOptions& o, int world) {
  sim::Degradations d;
  const auto parsed = [](const char* flag, const std::string& text, auto parse) {
    try {
      return parse(text);
    } catch (const std::invalid_argument& error) {
      throw UserError(fmt::format("{} {}", flag, error.what()));
    }
  };
  for (const std::string& text : o.slow_gpus) d.gpus.push_back(parsed("--slow-gpu", text, sim::parse_slow_gpu));
  if (o.slow_gpu_fraction > 0) {
    for (const sim::SlowGpu& gpu : sim::draw_slow_gpus(world, o.slow_gpu_fraction, o.slow_gpu_factor, o.seed)) {
      d.gpus.push_back(gpu);
    }
  }
  for (const std::string& text : o.slow_links) d.links.push_back(parsed("--slow-link", text, sim::parse_slow_link));
  for (const std::string& text : o.failed_uplinks) {
    d.links.push_back(parsed("--failed-uplink", text, sim::parse_failed_uplink));
  }
  return d;
}

nlohmann::json degradations_json(const sim::Degradations& d, double healthy_iteration_time_s) {
  nlohmann::json gpus = nlohmann::json::array(), links = nlohmann::json::array();
  for (const sim::SlowGpu& gpu : d.gpus) gpus.push_back({{"rank", gpu.rank}, {"factor", gpu.factor}});
  for (const sim::SlowLink& link : d.links) {
    const char* part = link.part == sim::SlowLink::Part::Nic      ? "nic"
                       : link.part == sim::SlowLink::Part::NvLink ? "nvlink"
                                                                  : "uplink";
    nlohmann::json entry{{"part", part}, {"factor", link.factor}};
    if (link.part == sim::SlowLink::Part::UpLink) {
      entry["leaf"] = link.leaf, entry["spine"] = link.spine;
    } else {
      entry["rank"] = link.rank;
    }
    links.push_back(entry);
  }
  return {{"healthy_iteration_time_s", healthy_iteration_time_s}, {"slow_gpus", gpus}, {"slow_links", links}};
}

// A Chrome trace's size, estimated before simulating: one JSON event per op of each traced rank, about
// kTraceBytesPerEvent each (measured: `twin sim gpt3-175b --trace-ranks 0-63` writes 695616 events in 132.8 MB, 191
// bytes each). Past kLargeTraceBytes (a file Perfetto opens slowly, and the simulator keeps every traced op in memory
// meanwhile) the trace needs --large-trace.
constexpr double kTraceBytesPerEvent = 200;
constexpr double kLargeTraceBytes = 200e6;

double estimated_trace_bytes(const model::Program& program, const std::vector<int>& traced_ranks) {
  std::vector<int> ranks = traced_ranks;
  if (ranks.empty()) {  // the default: dp 0, tp 0 of every stage
    for (int stage = 0; stage < program.stages(); ++stage) ranks.push_back(program.layout.rank_of({0, stage, 0}));
  }
  double events = 0;
  for (int rank : ranks) {
    events += static_cast<double>(program.ops_per_rank(program.layout.coord_of(rank).pp)) + 5;  // + metadata
  }
  return events * kTraceBytesPerEvent;
}

// A whole training run at the simulated iteration time: what a planner buys. Every iteration at the full global
// batch (no batch-size ramp-up), no evaluation, checkpoints or restarts.
struct TrainingEstimate {
  double tokens = 0, tokens_per_iteration = 0, iterations = 0, time_s = 0, gpu_hours = 0;
};

TrainingEstimate training_estimate(const model::Scenario& s, double iteration_time_s, double tokens) {
  TrainingEstimate e;
  e.tokens = tokens;
  e.tokens_per_iteration = static_cast<double>(s.parallel.global_batch * s.model.seq_len);
  e.iterations = std::ceil(tokens / e.tokens_per_iteration);
  e.time_s = e.iterations * iteration_time_s;
  e.gpu_hours = e.time_s / 3600 * static_cast<double>(s.cluster.total_gpus());
  return e;
}

// 3.15e6 -> "3.15 M": the scale a person reads counts of tokens and hours in.
std::string with_scale(double value) {
  for (const auto& [scale, name] : {std::pair{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}}) {
    if (value >= scale) return fmt::format("{:.4g} {}", value / scale, name);
  }
  return fmt::format("{:.4g}", value);
}

// The measured GPU constants the cost model rests on, and whose they are: a large GEMM's rate, a streaming kernel's
// bandwidth, and the share of it the attention core's batched GEMMs reach (cited: sim/cost_model.cpp).
// Where a GPU constant came from: the cluster's measurement key, its profile (cluster.gpu_profile), or a citation.
const char* constant_source(bool measured_here, bool from_profile, const char* key) {
  return !measured_here ? "cited" : from_profile ? "cluster.gpu_profile" : key;
}

std::string gpu_constants_line(const sim::AnalyticalParameters& p, const topology::GpuSpec& gpu, bool from_profile) {
  const auto& shape = p.gemm_measured_shape;
  const bool any_cited = !p.gemm_measured_here || !p.hbm_measured_here || !p.attention_measured_here;
  return fmt::format(
      "GPU constants: GEMM {:.1f} TFLOP/s at {:g}x{:g}x{:g} ({}), HBM {:.0f} GB/s ({}), attention GEMMs at {:.2f} of "
      "it ({}){}",
      p.gemm_measured_flops_per_s / 1e12, shape[0], shape[1], shape[2],
      constant_source(p.gemm_measured_here, from_profile, "cluster.gemm_tflops"),
      gpu.hbm_bytes_per_s * p.hbm_efficiency / 1e9,
      constant_source(p.hbm_measured_here, from_profile, "cluster.hbm_gb_per_s"), p.attention_gemm_hbm_fraction,
      constant_source(p.attention_measured_here, from_profile, "cluster.attention_gemm_hbm_fraction"),
      any_cited ? "; your own: bench/gpu twin_gemm_peak" : "");
}

// The framework model the Program and the replay followed, by its scenario keys (docs/accuracy.md has what each
// does): which release's behaviour the prediction assumes matters as much as the hardware.
std::string framework_line(const model::Scenario& s) {
  const auto& f = s.framework;
  const std::string common = fmt::format("fused_kernels = {}, dropout = {}, attention = {}", f.fused_kernels, f.dropout,
                                         model::to_string(f.attention));
  if (f.name == model::Framework::Composer) {
    return fmt::format("framework: composer (PyTorch 1.13 kernels, {}), dropout = {}, attention = {}",
                       s.parallel.zero_stage == 3 ? "FSDP FULL_SHARD" : "DDP", f.dropout,
                       model::to_string(f.attention));
  }
  if (f.name == model::Framework::DeepSpeed) {
    // framework.deepspeed_version when given; else the release each engine model was read in.
    const bool given = f.deepspeed_version != std::array<int, 3>{0, 0, 0};
    const std::string release = given ? "v" + model::version_text(f.deepspeed_version) : "";
    const std::string engine = f.bf16_optimizer
                                   ? (given ? "BF16_Optimizer of " + release : "BF16_Optimizer of v0.6.2 on")
                                   : "pipeline engine of " + (given ? release : std::string("v0.5"));
    return fmt::format("framework: deepspeed, {} (bf16_optimizer = {}), {}", engine, f.bf16_optimizer, common);
  }
  return fmt::format(
      "framework: megatron (tp_comm_overlap = {}, gradient_accumulation_fusion = {}, "
      "pipeline_gather_copies = {}), {}",
      f.tp_comm_overlap, f.gradient_accumulation_fusion, f.pipeline_gather_copies, common);
}

nlohmann::json gpu_constants_json(const sim::AnalyticalParameters& p, const topology::GpuSpec& gpu,
                                  bool from_profile) {
  return {{"gemm_tflops", p.gemm_measured_flops_per_s / 1e12},
          {"gemm_shape", p.gemm_measured_shape},
          {"gemm_source", constant_source(p.gemm_measured_here, from_profile, "cluster.gemm_tflops")},
          {"hbm_gb_per_s", gpu.hbm_bytes_per_s * p.hbm_efficiency / 1e9},
          {"hbm_source", constant_source(p.hbm_measured_here, from_profile, "cluster.hbm_gb_per_s")},
          {"attention_gemm_hbm_fraction", p.attention_gemm_hbm_fraction},
          {"attention_source",
           constant_source(p.attention_measured_here, from_profile, "cluster.attention_gemm_hbm_fraction")}};
}

// The simulated work, bounded before any of it (README "Reliability"): building the platform grows with the square of
// the nodes (topology/platform.hpp's measurement), a day of it at about 470,000 nodes.
void require_platform_within_bound(const model::ClusterSpec& cluster) {
  constexpr double kMaxBuildS = 24 * 3600.0;
  const double estimate_s = topology::estimated_build_seconds(static_cast<int>(std::min<std::int64_t>(
      cluster.nodes, std::numeric_limits<int>::max())));
  if (estimate_s > kMaxBuildS) {
    throw UserError(fmt::format(
        "cluster.nodes = {}: building its platform in SimGrid would take about {:.0f} h on a 2-core machine (it grows "
        "with the square of the nodes; bench/sim/platform_build.sh measures it); twin sim refuses past {:.0f} h",
        cluster.nodes, estimate_s / 3600, kMaxBuildS / 3600));
  }
}

// What a user set that the prediction does not show, one sentence each (printed as `note:` lines, JSON "notes").
std::vector<std::string> scenario_notes(const model::Scenario& s) {
  std::vector<std::string> notes;
  if (model::expert_load_skew_capped(s)) {
    notes.push_back(fmt::format(
        "model.expert_load_skew = {:g} does not change this prediction: model.capacity_factor = {:g} caps every "
        "expert's tokens (Megatron-Core drops the rest), so the hottest EP rank receives no more than with balanced "
        "routing; model.capacity_factor = 0 (dropless) lets the skew slow it",
        s.model.expert_load_skew, s.model.capacity_factor));
  }
  // Not refused at cp 1: the executor's context-parallel parity runs its single-rank reference with these keys.
  if (s.parallel.cp == 1 && s.framework.cp_comm != model::CpComm::P2P) {
    notes.push_back(fmt::format("framework.cp_comm = \"{}\" does not change this prediction: parallel.cp = 1 exchanges "
                                "nothing",
                                model::to_string(s.framework.cp_comm)));
  }
  return notes;
}

void run(const SimCommandOptions& o) {
  require_a_run_to_price(o.usd_per_gpu_hour > 0, !o.train_tokens.empty());
  const model::Scenario scenario = load_scenario(o.scenario);
  require_platform_within_bound(scenario.cluster);
  require_outputs_before_work({{"--json", o.json_path}, {"--trace", o.trace_path}, {"--svg", o.svg_path}},
                              {scenario_input(o.scenario), {"--profile", o.profile},
                               {"cluster.gpu_profile", scenario.cluster.gpu_profile}});
  const auto granularity = o.granularity == "op" ? model::Granularity::Op : model::Granularity::Layer;
  const model::Program program = build_program_within_memory(scenario, granularity);

  sim::SimOptions options;
  const MeasuredHardware measured_hardware = read_measured_hardware(scenario, o.profile, !o.gpu.empty());
  const bool host_profile = measured_hardware.host.has_value();
  try {
    options.fidelity = sim::parse_fidelity(o.fidelity);
    options.algorithm = sim::parse_collective_algorithm(o.algorithm);
    if (!o.gpu.empty()) {
      options.node = topology::job_part_of_node(topology::node_spec_by_gpu_name(o.gpu), scenario.cluster.gpus_per_node);
    } else if (host_profile || measured_hardware.gpu) {
      const topology::NodeSpec cited = host_profile ? topology::NodeSpec{} : topology::node_spec(scenario.cluster);
      options.node = measured_hardware.node(cited, program.layout.world_size());
    }
    if (host_profile) options.fabric = topology::cpu_host_fabric(*measured_hardware.host);
    // The fabric of the node's generation: HDR for DGX A100, NDR for DGX H100/H200.
    topology::FabricSpec fabric = host_profile       ? *options.fabric
                                  : o.gpu.empty()     ? topology::fabric_spec(scenario.cluster)
                                  : o.gpu == "a100" ? topology::infiniband_hdr_fat_tree()
                                                    : topology::infiniband_ndr_fat_tree();
    fabric.oversubscription = o.oversubscription;
    fabric.rail_optimized = fabric.rail_optimized || o.rail_optimized;  // cluster.rail_optimized, or the flag
    options.fabric = fabric;
    if (!o.trace_ranks.empty()) {
      options.record_ranks = report::parse_rank_list(o.trace_ranks, program.layout.world_size());
    }
  } catch (const std::invalid_argument& error) {
    throw UserError(error.what());
  }
  if (!o.trace_path.empty() && !o.large_trace) {
    const double bytes = estimated_trace_bytes(program, options.record_ranks);
    if (bytes > kLargeTraceBytes) {
      throw UserError(
          fmt::format("--trace of {} would be about {:.1f} GB ({:.0f} bytes per op): add --large-trace to write it "
                      "anyway, or trace "
                      "fewer ranks (--trace-ranks){}",
                      o.trace_ranks.empty() ? "one rank per stage" : "ranks " + o.trace_ranks, bytes / 1e9,
                      kTraceBytesPerEvent, granularity == model::Granularity::Op ? " or at --granularity layer" : ""));
    }
  }
  options.placement = o.placement;
  options.ideal_network = o.ideal_network;
  options.progress = !o.quiet;
  options.degradations = degradations(o, program.layout.world_size());
  // The slow GPUs' own timelines too (a few), so that the report shows their compute beside the waits it caused;
  // a trace shows them too, unless --trace-ranks names others.
  const std::vector<int> traced_ranks = options.record_ranks;
  for (std::size_t i = 0; i < options.degradations.gpus.size() && i < 16; ++i) {
    const int rank = options.degradations.gpus[i].rank;
    if (rank < program.layout.world_size()) options.record_ranks.push_back(rank);
  }
  // one simulation in this process, unless more follow (in children): the sensitivities, or the healthy run
  options.isolate = o.sensitivity_percent > 0 || !options.degradations.empty();

  const topology::NodeSpec node = options.node ? *options.node : topology::node_spec(scenario.cluster);
  // The cluster's own GPU measurements describe the scenario's GPU: a --gpu what-if on another GPU uses its cited
  // values instead (and says so).
  const bool same_gpu = host_profile || node.gpu.name == topology::node_spec(scenario.cluster.node).gpu.name;
  const bool measured = scenario.cluster.gemm_tflops > 0 || scenario.cluster.hbm_gb_per_s > 0 ||
                        scenario.cluster.attention_gemm_hbm_fraction > 0;
  sim::AnalyticalParameters parameters;
  try {
    parameters = same_gpu ? measured_hardware.parameters(node.gpu, scenario.cluster)
                          : sim::analytical_parameters(node.gpu);
    if (!same_gpu) parameters.host_s_per_kernel = sim::host_s_per_kernel(scenario.cluster, node);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", scenario.source, error.what()));
  }
  const sim::AnalyticalCostModel cost(node.gpu, parameters);
  sim::SimResult result;
  try {
    // auto would take group fidelity at this size, but the placement splits TP groups across nodes: say why this
    // run takes seconds to minutes instead of a fraction of a second.
    if (options.fidelity == sim::Fidelity::Auto && !o.quiet &&
        program.layout.world_size() > options.group_fidelity_above_gpus &&
        sim::choose_fidelity(program, options) == sim::Fidelity::Rank) {
      fmt::print(stderr,
                 "twin sim: placement {} puts TP groups across nodes, which group fidelity cannot simulate: all {} "
                 "GPUs at rank fidelity (slower: seconds at a hundred GPUs, minutes at a thousand)\n",
                 o.placement, program.layout.world_size());
    }
    result = sim::simulate(program, cost, options);
  } catch (const sim::SimulationError& error) {
    throw UserError(error.what());
  }
  std::optional<report::Timeline> healthy;  // with degradations: the same run without them
  if (!options.degradations.empty()) {
    sim::SimOptions healthy_options = options;
    healthy_options.degradations = {};
    healthy_options.fidelity = result.fidelity;  // auto would take replica fidelity without the degradations
    healthy_options.progress = false;
    healthy = sim::simulate(program, cost, healthy_options).timeline;
  }

  const std::string engine =
      fmt::format("sim, {} fidelity, {} cost model, {}", sim::to_string(result.fidelity), cost.name(), result.hardware);
  report::Summary summary = report::summarize(program, result.timeline, result.peak_flops_per_gpu, engine,
                                              result.gpu_memory_bytes, sim::layer_parts(cost, program.scenario));
  if (!o.gpu.empty()) summary.hardware = node.gpu.name;  // a what-if on another GPU than the scenario's node
  // The band beside the iteration time: how far twin has been off on published runs like this plan.
  const PredictionBand band = prediction_band(scenario, node.gpu.name, result.timeline.iteration_time_s);
  std::string table = report::summary_table(summary);
  const auto iteration_line = table.find("iteration time");
  const auto after = iteration_line == std::string::npos ? std::string::npos : table.find('\n', iteration_line);
  if (after != std::string::npos) table.insert(after + 1, "  " + band_line(band) + "\n");
  fmt::print("{}", table);
  if (healthy) fmt::print("\n{}", sim::slowdown_report(program, *healthy, result.timeline));
  std::optional<TrainingEstimate> training;
  if (!o.train_tokens.empty()) {
    training = training_estimate(scenario, result.timeline.iteration_time_s,
                                 parse_token_count("--train-tokens", o.train_tokens));
    fmt::print(
        "\n  training {} tokens: {:.0f} iterations of {} tokens, {:.1f} days on {} GPUs, {} GPU-hours (every iteration "
        "at the full global batch; no ramp-up, evaluation or restarts)\n",
        with_scale(training->tokens), training->iterations, with_scale(training->tokens_per_iteration),
        training->time_s / 86400, scenario.cluster.total_gpus(), with_scale(training->gpu_hours));
    if (o.usd_per_gpu_hour > 0) {
      fmt::print("  at ${:g} per GPU-hour: ${} (GPU time alone: no storage, network egress or idle reservation)\n",
                 o.usd_per_gpu_hour, with_scale(training->gpu_hours * o.usd_per_gpu_hour));
    }
  }
  std::optional<GoodputReport> goodput;
  if (o.goodput) {
    goodput = goodput_report(scenario, result.timeline.iteration_time_s, 0, training ? training->tokens : 0);
    fmt::print("\n{}", goodput_lines(*goodput));
  }
  if (host_profile) {
    fmt::print("\n  {}\n", measured_hardware.line());
  } else {
    fmt::print("\n  {}\n", gpu_constants_line(parameters, node.gpu, measured_hardware.gpu.has_value()));
    if (measured_hardware.gpu) fmt::print("  {}\n", measured_hardware.line());
  }
  fmt::print("  {}\n", framework_line(scenario));
  const std::vector<std::string> notes = scenario_notes(scenario);
  for (const std::string& note : notes) fmt::print("  note: {}\n", note);
  const bool own_network = scenario.cluster.nics_per_node > 0 || scenario.cluster.nic_gbps > 0;
  if (own_network && !o.gpu.empty()) {
    fmt::print(
        "  note: cluster.nics_per_node / cluster.nic_gbps describe the scenario's network; --gpu {} uses the {}'s "
        "own NICs\n",
        o.gpu, node.name);
  }
  if (measured && !same_gpu) {
    fmt::print(
        "  note: cluster.gemm_tflops / hbm_gb_per_s / attention_gemm_hbm_fraction measure the scenario's {}; --gpu "
        "{} uses the cited {} values\n",
        topology::node_spec(scenario.cluster.node).gpu.name, o.gpu, node.gpu.name);
  }
  const auto& stats = result.stats;
  fmt::print(
      "\n  simulated by {} actors: {} ops ({} over every rank), {} SimGrid activities in {:.2f} s wall "
      "({:.2f} M activities/s), peak memory {:.0f} MB\n",
      stats.actors, stats.ops, stats.rank_ops, stats.activities, stats.wall_s,
      stats.wall_s > 0 ? static_cast<double>(stats.activities) / stats.wall_s / 1e6 : 0.0, stats.peak_rss_bytes / 1e6);

  std::vector<sim::RateSensitivity> sensitivities;
  if (o.sensitivity_percent > 0) {
    if (!o.quiet) {
      fmt::print(stderr, "twin sim: sensitivity: {} more simulations, each rate {:g} % lower and higher\n",
                 sim::rate_sensitivity_simulations(), o.sensitivity_percent);
    }
    try {
      sensitivities =
          sim::rate_sensitivities(program, parameters, node, *options.fabric, options, o.sensitivity_percent);
    } catch (const sim::SimulationError& error) {
      throw UserError(error.what());
    }
    const double base = result.timeline.iteration_time_s;
    fmt::print(
        "\n  sensitivity: the iteration time with one rate {:g} % lower / higher, and the share of the time it "
        "governs (-d ln T / d ln rate):\n",
        o.sensitivity_percent);
    bool capped = false;
    for (const sim::RateSensitivity& one : sensitivities) {
      const bool at_ceiling = one.higher_factor < 1 + o.sensitivity_percent / 100 - 1e-12;
      capped |= at_ceiling;
      fmt::print("    {:<38} {:>+7.2f} % / {:>+7.2f} %{}  {:>5.2f}\n", one.what, 100 * (one.lower_s / base - 1),
                 100 * (one.higher_s / base - 1), at_ceiling ? "*" : " ", one.elasticity());
    }
    if (capped) fmt::print("    * higher only up to the datasheet's rate (the share is taken over what was applied)\n");
  }

  if (!o.json_path.empty()) {
    nlohmann::json json = report::summary_to_json(summary);
    if (!sensitivities.empty()) {
      nlohmann::json list = nlohmann::json::array();
      for (const sim::RateSensitivity& one : sensitivities) {
        list.push_back({{"rate", one.rate},
                        {"percent", o.sensitivity_percent},
                        {"lower_s", one.lower_s},
                        {"higher_s", one.higher_s},
                        {"lower_factor", one.lower_factor},
                        {"higher_factor", one.higher_factor},
                        {"elasticity", one.elasticity()}});
      }
      json["sensitivity"] = list;
    }
    json["fits"] = summary.memory.fits;  // also under memory: the plan's peak within one GPU's memory
    json["fidelity"] = sim::to_string(result.fidelity);
    json["hardware"] = result.hardware;
    json["cost_model"] = cost.name();
    if (host_profile) {
      json["host_profile"] = measured_hardware.json();
    } else {
      json["gpu_constants"] = gpu_constants_json(parameters, node.gpu, measured_hardware.gpu.has_value());
      if (measured_hardware.gpu) json["gpu_profile"] = measured_hardware.json();
    }
    json["granularity"] = model::to_string(program.granularity);
    json["notes"] = notes;
    add_band_json(band, json);
    if (training) {
      json["training"] = {
          {"tokens", training->tokens},         {"tokens_per_iteration", training->tokens_per_iteration},
          {"iterations", training->iterations}, {"time_s", training->time_s},
          {"days", training->time_s / 86400},   {"gpu_hours", training->gpu_hours}};
      if (o.usd_per_gpu_hour > 0) {
        json["training"]["usd_per_gpu_hour"] = o.usd_per_gpu_hour;
        json["training"]["cost_usd"] = training->gpu_hours * o.usd_per_gpu_hour;
      }
      if (goodput) json["training"]["days_with_failures"] = goodput->train_days_with_failures;
    }
    if (goodput) json["goodput"] = goodput_json(*goodput);
    if (healthy) json["degraded"] = degradations_json(options.degradations, healthy->iteration_time_s);
    write_file_atomically(o.json_path, json.dump(2) + "\n");
    fmt::print("  summary written to {}\n", o.json_path);
  }
  if (!o.trace_path.empty()) {
    write_file_atomically(o.trace_path, report::chrome_trace(program, result.timeline, traced_ranks));
    fmt::print("  trace written to {} (open in https://ui.perfetto.dev)\n", o.trace_path);
  }
  if (!o.svg_path.empty()) {
    write_file_atomically(o.svg_path, report::pipeline_svg(program, result.timeline));
    fmt::print("  pipeline diagram written to {}\n", o.svg_path);
  }
}

}  // namespace

void register_sim_command(CLI::App& app) {
  auto o = std::make_shared<SimCommandOptions>();
  CLI::App* command = app.add_subcommand("sim", "simulate one training iteration on a model of the cluster (SimGrid)");
  add_scenario_options(*command, o->scenario);
  command
      ->add_option("--fidelity", o->fidelity,
                   "rank: one actor per GPU, every collective as flows; group: one actor per TP group, TP "
                   "collectives analytical; replica: group fidelity for one pipeline replica, the others mirroring "
                   "it, every replica's collectives on the fabric; auto: group above 64 GPUs, replica above 4096")
      ->check(CLI::IsMember({"auto", "rank", "group", "replica"}));
  command->add_option("--granularity", o->granularity, "layer (one op per layer and phase) or op (every kernel)")
      ->check(CLI::IsMember({"op", "layer"}));
  command->add_option("--gpu", o->gpu, "replace the scenario's GPU: a100, h100 or h200 (in its DGX node)")
      ->check(CLI::IsMember({"a100", "h100", "h200"}));
  command->add_option("--profile", o->profile,
                      "a hardware profile twin calibrate wrote (a cpu-host's rates, or a GPU's), in place of the "
                      "scenario's cluster.gpu_profile")
      ->check(CLI::ExistingFile);
  command->add_option("--placement", o->placement,
                      "rank to GPU order, innermost axis first (Megatron: tp-dp-pp; what-if: tp-pp-dp, dp-tp-pp, ...)");
  command
      ->add_option("--algorithm", o->algorithm,
                   "collective algorithm: auto (as NCCL), ring, tree, hierarchical, "
                   "analytical")
      ->check(CLI::IsMember({"auto", "ring", "tree", "hierarchical", "analytical"}));
  command->add_option("--oversubscription", o->oversubscription, "fat-tree leaf down:up ratio (1 = non-blocking)")
      ->check(between(1, 64));
  command->add_flag("--rail-optimized", o->rail_optimized, "rail-optimized fabric (a scalable unit under one leaf)");
  command->add_flag("--ideal-network", o->ideal_network, "infinite bandwidth and zero latency (the schedule alone)");
  command->add_option("--json", o->json_path, "write the summary as JSON")->check(output_file());
  command->add_option("--trace", o->trace_path, "write a Chrome trace (Perfetto) of the recorded ranks")
      ->check(output_file());
  command
      ->add_option("--trace-ranks", o->trace_ranks,
                   "ranks to trace, e.g. 0,8,16-23 (default: dp 0, tp 0 of every stage)")
      ->needs("--trace");
  command
      ->add_flag("--large-trace", o->large_trace,
                 "write a trace estimated past 200 MB (refused without it: say so before simulating)")
      ->needs("--trace");
  command->add_option("--svg", o->svg_path, "write a pipeline diagram of the iteration (SVG)")->check(output_file());
  command->add_flag("--quiet", o->quiet, "no progress line");
  command
      ->add_option(
          "--sensitivity", o->sensitivity_percent,
          "also simulate each rate of the hardware model (GEMM, HBM, attention GEMMs, kernel launches, NVLink, "
          "network) this many percent lower and higher (e.g. 10), and report how the iteration time moves")
      ->check(between(1, 50));
  command
      ->add_option("--train-tokens", o->train_tokens,
                   "also estimate a whole training run of this many tokens (300e9, 300B, 1.4T): iterations, days, "
                   "GPU-hours")
      ->check(token_count("--train-tokens"));
  command
      ->add_option("--usd-per-gpu-hour", o->usd_per_gpu_hour,
                   "with --train-tokens: the run's GPU-hours priced at this many dollars per GPU-hour (e.g. 2.5)")
      ->check(between(0.001, 1000));
  command->add_option("--slow-gpu", o->slow_gpus,
                      "RANK:FACTOR: that GPU's compute takes FACTOR times as long (repeatable); the report says where "
                      "the time went against the healthy run");
  command->add_option("--slow-gpu-fraction", o->slow_gpu_fraction,
                      "a fraction of the GPUs, drawn with --seed, each slowed by --slow-gpu-factor")
      ->check(between(0, 1));
  command->add_option("--slow-gpu-factor", o->slow_gpu_factor, "the slowdown of --slow-gpu-fraction's GPUs (1.5)")
      ->check(between(1, 100))
      ->needs("--slow-gpu-fraction");
  command->add_option("--seed", o->seed, "the draw of --slow-gpu-fraction (default 1)")->needs("--slow-gpu-fraction");
  command->add_option("--slow-link", o->slow_links,
                      "nic:RANK:FACTOR, nvlink:RANK:FACTOR or uplink:LEAF:SPINE:FACTOR: that link at FACTOR of its "
                      "bandwidth (repeatable)");
  command->add_option("--failed-uplink", o->failed_uplinks,
                      "LEAF:SPINE: that leaf's up-link failed, its traffic rerouted over the leaf's other up-links "
                      "(repeatable)");
  command->add_flag("--goodput", o->goodput,
                    "also the goodput at this iteration time: interruptions, checkpoints and restarts by the "
                    "scenario's failure model (twin goodput)");
  command->callback([o] { run(*o); });
}

}  // namespace twin::cli

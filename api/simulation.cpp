// One simulation as `twin sim` runs it: the options resolved from the request (hardware, fabric, degradations), the
// replay, the summary, and the extras asked for; then the JSON document of it all.
#include "api/simulation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include <fmt/core.h>
#include <unistd.h>

#include "api/scenario.hpp"
#include "api/token_count.hpp"
#include "model/ops/expert_load.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/scenario/errors.hpp"
#include "report/pipeline.hpp"
#include "report/trace.hpp"
#include "sim/simgrid_library.hpp"
#include "topology/platform.hpp"

namespace twin::api {
namespace {

// The --slow-gpu, --slow-gpu-fraction, --slow-link and --failed-uplink what-ifs, parsed (UserError naming the flag).
sim::Degradations degradations(const SimRequest& o, int world) {
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

TrainingEstimate training_estimate(const model::Scenario& s, double iteration_time_s, double tokens) {
  TrainingEstimate e;
  e.tokens = tokens;
  e.tokens_per_iteration = static_cast<double>(s.parallel.global_batch * s.model.seq_len);
  e.iterations = std::ceil(tokens / e.tokens_per_iteration);
  e.time_s = e.iterations * iteration_time_s;
  e.gpu_hours = e.time_s / 3600 * static_cast<double>(s.cluster.total_gpus());
  return e;
}

// The measured GPU constants the cost model rests on, and whose they are: a large GEMM's rate, a streaming kernel's
// bandwidth, and the share of it the attention core's batched GEMMs reach (cited: sim/cost_model.cpp).
// Where a GPU constant came from: the cluster's measurement key, its profile (cluster.gpu_profile), or a citation.
const char* constant_source(bool measured_here, bool from_profile, const char* key) {
  return !measured_here ? "cited" : from_profile ? "cluster.gpu_profile" : key;
}

nlohmann::json gpu_constants_json(const sim::AnalyticalParameters& p, const topology::GpuSpec& gpu, bool from_profile) {
  return {{"gemm_tflops", p.gemm_measured_flops_per_s / 1e12},
          {"gemm_shape", p.gemm_measured_shape},
          {"gemm_source", constant_source(p.gemm_measured_here, from_profile, "cluster.gemm_tflops")},
          {"hbm_gb_per_s", gpu.hbm_bytes_per_s * p.hbm_efficiency / 1e9},
          {"hbm_source", constant_source(p.hbm_measured_here, from_profile, "cluster.hbm_gb_per_s")},
          {"attention_gemm_hbm_fraction", p.attention_gemm_hbm_fraction},
          {"attention_source",
           constant_source(p.attention_measured_here, from_profile, "cluster.attention_gemm_hbm_fraction")}};
}

// The simulated work, bounded before any of it (README "Reliability"): the platform's memory grows with its hosts
// (topology/platform.hpp's measurement), taken here at one host per GPU (rank fidelity, the most), and a platform
// past this machine's memory is refused rather than left to the kernel's out-of-memory killer.
void require_platform_within_bound(const model::ClusterSpec& cluster) {
  const double estimate_bytes = topology::estimated_platform_bytes(cluster.nodes, cluster.gpus_per_node);
  const double machine_bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (machine_bytes > 0 && estimate_bytes > machine_bytes) {
    throw UserError(fmt::format(
        "cluster.nodes = {}: its platform in SimGrid would take about {:.0f} GB of memory ({:.0f} KB a node with a "
        "host per GPU; bench/sim/platform_build.sh measures it), past this machine's {:.0f} GB; twin sim refuses it",
        cluster.nodes, estimate_bytes / 1e9, estimate_bytes / static_cast<double>(cluster.nodes) / 1e3,
        machine_bytes / 1e9));
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
    notes.push_back(
        fmt::format("framework.cp_comm = \"{}\" does not change this prediction: parallel.cp = 1 exchanges "
                    "nothing",
                    model::to_string(s.framework.cp_comm)));
  }
  if (model::flex_dispatch_changes_nothing(s)) {
    notes.push_back(s.parallel.ep == 1
                        ? std::string("framework.moe_dispatcher = \"flex\" does not change this prediction: "
                                      "parallel.ep = 1 exchanges no tokens")
                        : fmt::format("framework.moe_dispatcher = \"flex\" does not change this prediction: it sends "
                                      "what the all-to-all dispatcher does here (model.experts = {} over parallel.ep = "
                                      "{}: a token reaches each rank at most once either way)",
                                      s.model.experts, s.parallel.ep));
  }
  return notes;
}

// The simulator's options for `program` as `request` asks: the node (a what-if GPU, a profile's measurements), the
// fabric of its generation, the recorded ranks, the degradations. Throws UserError naming the flag.
sim::SimOptions sim_options(const model::Scenario& scenario, const model::Program& program, const SimRequest& r,
                            const MeasuredHardware& measured_hardware, std::vector<int>& traced_ranks) {
  sim::SimOptions options;
  const bool host_profile = measured_hardware.host.has_value();
  try {
    options.fidelity = sim::parse_fidelity(r.fidelity);
    options.algorithm = sim::parse_collective_algorithm(r.algorithm);
    if (!r.gpu.empty()) {
      options.node = topology::job_part_of_node(topology::node_spec_by_gpu_name(r.gpu), scenario.cluster.gpus_per_node);
    } else if (host_profile || measured_hardware.gpu) {
      const topology::NodeSpec cited = host_profile ? topology::NodeSpec{} : topology::node_spec(scenario.cluster);
      options.node = measured_hardware.node(cited, program.layout.world_size());
    }
    if (host_profile) options.fabric = topology::cpu_host_fabric(*measured_hardware.host);
    // The fabric of the node's generation: HDR for DGX A100, NDR for DGX H100/H200.
    topology::FabricSpec fabric = host_profile      ? *options.fabric
                                  : r.gpu.empty()   ? topology::fabric_spec(scenario.cluster)
                                  : r.gpu == "a100" ? topology::infiniband_hdr_fat_tree()
                                                    : topology::infiniband_ndr_fat_tree();
    fabric.oversubscription = r.oversubscription;
    fabric.rail_optimized = fabric.rail_optimized || r.rail_optimized;  // cluster.rail_optimized, or the flag
    options.fabric = fabric;
    if (!r.trace_ranks.empty()) {
      options.record_ranks = report::parse_rank_list(r.trace_ranks, program.layout.world_size());
    }
  } catch (const std::invalid_argument& error) {
    throw UserError(error.what());
  }
  if (r.trace && !r.large_trace) {
    const double bytes = estimated_trace_bytes(program, options.record_ranks);
    if (bytes > kLargeTraceBytes) {
      throw UserError(fmt::format(
          "--trace of {} would be about {:.1f} GB ({:.0f} bytes per op): add --large-trace to write it "
          "anyway, or trace "
          "fewer ranks (--trace-ranks){}",
          r.trace_ranks.empty() ? "one rank per stage" : "ranks " + r.trace_ranks, bytes / 1e9, kTraceBytesPerEvent,
          program.granularity == model::Granularity::Op ? " or at --granularity layer" : ""));
    }
  }
  options.placement = r.placement;
  options.ideal_network = r.ideal_network;
  options.progress = r.progress;
  options.degradations = degradations(r, program.layout.world_size());
  traced_ranks = options.record_ranks;
  // The slow GPUs' own timelines too (a few), so that the report shows their compute beside the waits it caused;
  // a trace shows them too, unless --trace-ranks names others.
  for (std::size_t i = 0; i < options.degradations.gpus.size() && i < 16; ++i) {
    const int rank = options.degradations.gpus[i].rank;
    if (rank < program.layout.world_size()) options.record_ranks.push_back(rank);
  }
  // one simulation here (or in a child, isolated), and more in children: the sensitivities, or the healthy run
  options.isolate = r.isolate || r.sensitivity_percent > 0 || !options.degradations.empty();
  return options;
}

// The replay, and with degradations the healthy one beside it. Says on stderr (with progress) why a run takes the
// slow path: auto falling back to rank fidelity, or rank fidelity of many GPUs on Debian's SimGrid.
void replay(Simulation& s, const SimRequest& r) {
  const sim::AnalyticalCostModel cost(s.node.gpu, s.parameters);
  s.cost_model = cost.name();
  try {
    const long long gpus = s.program.layout.world_size();
    if (r.progress && sim::choose_fidelity(s.program, s.options) == sim::Fidelity::Rank) {
      // auto would take group fidelity at this size, but the placement splits TP groups across nodes: say why this
      // run takes seconds to minutes instead of a fraction of a second.
      if (s.options.fidelity == sim::Fidelity::Auto && gpus > s.options.group_fidelity_above_gpus) {
        fmt::print(stderr,
                   "twin sim: placement {} puts TP groups across nodes, which group fidelity cannot simulate: all {} "
                   "GPUs at rank fidelity (slower: seconds at a hundred GPUs, minutes at a thousand)\n",
                   r.placement, gpus);
      }
      const auto hint = sim::rank_fidelity_hint(gpus, sim::simgrid_library_path());
      if (hint) fmt::print(stderr, "{}\n", *hint);
    }
    s.result = sim::simulate(s.program, cost, s.options);
  } catch (const sim::SimulationError& error) {
    throw UserError(error.what());
  }
  if (!s.options.degradations.empty()) {
    sim::SimOptions healthy_options = s.options;
    healthy_options.degradations = {};
    healthy_options.fidelity = s.result.fidelity;  // auto would take replica fidelity without the degradations
    healthy_options.progress = false;
    s.healthy = sim::simulate(s.program, cost, healthy_options).timeline;
  }
  const std::string engine = fmt::format("sim, {} fidelity, {} cost model, {}", sim::to_string(s.result.fidelity),
                                         cost.name(), s.result.hardware);
  s.summary = report::summarize(s.program, s.result.timeline, s.result.peak_flops_per_gpu, engine,
                                s.result.gpu_memory_bytes, sim::layer_parts(cost, s.program.scenario));
  if (!r.gpu.empty()) s.summary.hardware = s.node.gpu.name;  // a what-if on another GPU than the scenario's node
}

// What follows from the iteration time: the band, the training run and its price, the goodput, the sensitivities.
void add_extras(Simulation& s, const SimRequest& r) {
  const model::Scenario& scenario = s.program.scenario;
  const double iteration_time_s = s.result.timeline.iteration_time_s;
  // The band beside the iteration time: how far twin has been off on published runs like this plan.
  s.band = prediction_band(scenario, s.node.gpu.name, iteration_time_s);
  if (!r.train_tokens.empty()) {
    s.training = training_estimate(scenario, iteration_time_s, parse_token_count("--train-tokens", r.train_tokens));
    s.training->usd_per_gpu_hour = r.usd_per_gpu_hour > 0 ? r.usd_per_gpu_hour : scenario.cluster.usd_per_gpu_hour;
  }
  if (r.goodput) s.goodput = goodput_report(scenario, iteration_time_s, 0, s.training ? s.training->tokens : 0);
  s.notes = scenario_notes(scenario);
  if (r.sensitivity_percent > 0) {
    if (r.progress) {
      fmt::print(stderr, "twin sim: sensitivity: {} more simulations, each rate {:g} % lower and higher\n",
                 sim::rate_sensitivity_simulations(), r.sensitivity_percent);
    }
    try {
      s.sensitivities =
          sim::rate_sensitivities(s.program, s.parameters, s.node, *s.options.fabric, s.options, r.sensitivity_percent);
    } catch (const sim::SimulationError& error) {
      throw UserError(error.what());
    }
  }
}

nlohmann::json training_json(const TrainingEstimate& training, const std::optional<GoodputReport>& goodput) {
  nlohmann::json out = {{"tokens", training.tokens},         {"tokens_per_iteration", training.tokens_per_iteration},
                        {"iterations", training.iterations}, {"time_s", training.time_s},
                        {"days", training.time_s / 86400},   {"gpu_hours", training.gpu_hours}};
  if (training.usd_per_gpu_hour > 0) {
    out["usd_per_gpu_hour"] = training.usd_per_gpu_hour;
    out["cost_usd"] = training.gpu_hours * training.usd_per_gpu_hour;
  }
  if (goodput) out["days_with_failures"] = goodput->train_days_with_failures;
  return out;
}

}  // namespace

// 3.15e6 -> "3.15 M": the scale a person reads counts of tokens and hours in.
std::string with_scale(double value) {
  for (const auto& [scale, name] : {std::pair{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}}) {
    if (value >= scale) return fmt::format("{:.4g} {}", value / scale, name);
  }
  return fmt::format("{:.4g}", value);
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

void check_within_days(double days, const SimRequest& extras) {
  if (days == 0) return;
  if (!(days > 0) || !std::isfinite(days))
    throw UserError(fmt::format("--days: a number of days above 0, got {}", days));
  if (extras.train_tokens.empty()) {
    throw UserError("--days asks whether a training run finishes in time: give its length with --train-tokens");
  }
}

Simulation simulate(const model::Scenario& scenario, const SimRequest& r) {
  if (r.usd_per_gpu_hour > 0 && r.train_tokens.empty()) {
    throw UserError("--usd-per-gpu-hour prices a training run's GPU-hours: give its length with --train-tokens");
  }
  require_platform_within_bound(scenario.cluster);
  Simulation s;
  s.program = build_program_within_memory(scenario, parse_granularity(r.granularity, "--granularity"));
  s.measured_hardware = read_measured_hardware(scenario, r.profile, !r.gpu.empty());
  s.host_profile = s.measured_hardware.host.has_value();
  s.options = sim_options(scenario, s.program, r, s.measured_hardware, s.traced_ranks);
  s.node = s.options.node ? *s.options.node : topology::node_spec(scenario.cluster);
  // The cluster's own GPU measurements describe the scenario's GPU: a --gpu what-if on another GPU uses its cited
  // values instead (and says so).
  s.same_gpu = s.host_profile || s.node.gpu.name == topology::node_spec(scenario.cluster.node).gpu.name;
  s.measured = scenario.cluster.gemm_tflops > 0 || scenario.cluster.hbm_gb_per_s > 0 ||
               scenario.cluster.attention_gemm_hbm_fraction > 0;
  try {
    s.parameters = s.same_gpu ? s.measured_hardware.parameters(s.node.gpu, scenario.cluster)
                              : sim::analytical_parameters(s.node.gpu);
    if (!s.same_gpu) s.parameters.host_s_per_kernel = sim::host_s_per_kernel(scenario.cluster, s.node);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", scenario.source, error.what()));
  }
  replay(s, r);
  add_extras(s, r);
  return s;
}

nlohmann::json sim_document(const Simulation& s, const SimRequest& r) {
  nlohmann::json json = report::summary_to_json(s.summary);
  if (!s.sensitivities.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const sim::RateSensitivity& one : s.sensitivities) {
      list.push_back({{"rate", one.rate},
                      {"percent", r.sensitivity_percent},
                      {"lower_s", one.lower_s},
                      {"higher_s", one.higher_s},
                      {"lower_factor", one.lower_factor},
                      {"higher_factor", one.higher_factor},
                      {"elasticity", one.elasticity()}});
    }
    json["sensitivity"] = list;
  }
  json["fits"] = s.summary.memory.fits;  // also under memory: the plan's peak within one GPU's memory
  json["fidelity"] = sim::to_string(s.result.fidelity);
  json["hardware"] = s.result.hardware;
  json["cost_model"] = s.cost_model;
  if (s.host_profile) {
    json["host_profile"] = s.measured_hardware.json();
  } else {
    json["gpu_constants"] = gpu_constants_json(s.parameters, s.node.gpu, s.measured_hardware.gpu.has_value());
    if (s.measured_hardware.gpu) json["gpu_profile"] = s.measured_hardware.json();
  }
  json["granularity"] = model::to_string(s.program.granularity);
  json["notes"] = s.notes;
  add_band_json(s.band, json);
  if (s.training) json["training"] = training_json(*s.training, s.goodput);
  if (s.goodput) json["goodput"] = goodput_json(*s.goodput);
  if (s.healthy) json["degraded"] = degradations_json(s.options.degradations, s.healthy->iteration_time_s);
  // The boxes of the pipeline diagram, so that `twin report` draws it from this document alone.
  json["pipeline"] = report::pipeline_to_json(report::pipeline_of(s.program, s.result.timeline));
  return json;
}

}  // namespace twin::api

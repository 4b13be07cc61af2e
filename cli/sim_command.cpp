// twin sim SCENARIO: simulate one training iteration on a SimGrid model of the cluster and report it.
//   twin sim                                   MT-NLG 530B on 280 DGX A100 nodes
//   twin sim mtnlg-530b --nodes 420 --json out.json --svg pipeline.svg --trace trace.json --trace-ranks 0-7
// Parse, call the library (api/simulation.hpp), print.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "api/simulation.hpp"
#include "cli/commands.hpp"
#include "cli/simulation_pool.hpp"
#include "report/summary.hpp"
#include "report/svg.hpp"
#include "report/trace.hpp"

namespace twin::cli {
namespace {

struct SimCommandOptions {
  ScenarioOptions scenario;
  api::SimRequest request;
  std::string json_path, trace_path, svg_path;
  bool quiet = false;
};

// The summary table with the band under its iteration time, and what the request added below it.
void print_prediction(const api::Simulation& s) {
  std::string table = report::summary_table(s.summary);
  const auto iteration_line = table.find("iteration time");
  const auto after = iteration_line == std::string::npos ? std::string::npos : table.find('\n', iteration_line);
  if (after != std::string::npos) table.insert(after + 1, "  " + api::band_line(s.band) + "\n");
  fmt::print("{}", table);
  if (s.healthy) fmt::print("\n{}", sim::slowdown_report(s.program, *s.healthy, s.result.timeline));
  if (s.training) {
    const api::TrainingEstimate& t = *s.training;
    fmt::print(
        "\n  training {} tokens: {:.0f} iterations of {} tokens, {:.1f} days on {} GPUs, {} GPU-hours (every iteration "
        "at the full global batch; no ramp-up, evaluation or restarts)\n",
        api::with_scale(t.tokens), t.iterations, api::with_scale(t.tokens_per_iteration), t.time_s / 86400,
        s.program.scenario.cluster.total_gpus(), api::with_scale(t.gpu_hours));
    if (t.usd_per_gpu_hour > 0) {
      fmt::print("  at ${:g} per GPU-hour: ${} (GPU time alone: no storage, network egress or idle reservation)\n",
                 t.usd_per_gpu_hour, api::with_scale(t.gpu_hours * t.usd_per_gpu_hour));
    }
  }
  if (s.goodput) fmt::print("\n{}", api::goodput_lines(*s.goodput));
}

// Where the prediction's numbers come from (GPU constants or profile, framework), and the notes.
void print_provenance(const api::Simulation& s, const api::SimRequest& r) {
  const model::Scenario& scenario = s.program.scenario;
  if (s.host_profile) {
    fmt::print("\n  {}\n", s.measured_hardware.line());
  } else {
    fmt::print("\n  {}\n", api::gpu_constants_line(s.parameters, s.node.gpu, s.measured_hardware.gpu.has_value()));
    if (s.measured_hardware.gpu) fmt::print("  {}\n", s.measured_hardware.line());
  }
  fmt::print("  {}\n", api::framework_line(scenario));
  for (const std::string& note : s.notes) fmt::print("  note: {}\n", note);
  const bool own_network = scenario.cluster.nics_per_node > 0 || scenario.cluster.nic_gbps > 0;
  if (own_network && !r.gpu.empty()) {
    fmt::print(
        "  note: cluster.nics_per_node / cluster.nic_gbps describe the scenario's network; --gpu {} uses the {}'s "
        "own NICs\n",
        r.gpu, s.node.name);
  }
  if (s.measured && !s.same_gpu) {
    fmt::print(
        "  note: cluster.gemm_tflops / hbm_gb_per_s / attention_gemm_hbm_fraction measure the scenario's {}; --gpu "
        "{} uses the cited {} values\n",
        topology::node_spec(scenario.cluster.node).gpu.name, r.gpu, s.node.gpu.name);
  }
  const auto& stats = s.result.stats;
  fmt::print(
      "\n  simulated by {} actors: {} ops ({} over every rank), {} SimGrid activities in {:.2f} s wall "
      "({:.2f} M activities/s), peak memory {:.0f} MB\n",
      stats.actors, stats.ops, stats.rank_ops, stats.activities, stats.wall_s,
      stats.wall_s > 0 ? static_cast<double>(stats.activities) / stats.wall_s / 1e6 : 0.0, stats.peak_rss_bytes / 1e6);
}

void print_sensitivities(const api::Simulation& s, const api::SimRequest& r) {
  if (s.sensitivities.empty()) return;
  const double base = s.result.timeline.iteration_time_s;
  fmt::print(
      "\n  sensitivity: the iteration time with one rate {:g} % lower / higher, and the share of the time it "
      "governs (-d ln T / d ln rate):\n",
      r.sensitivity_percent);
  bool capped = false;
  for (const sim::RateSensitivity& one : s.sensitivities) {
    const bool at_ceiling = one.higher_factor < 1 + r.sensitivity_percent / 100 - 1e-12;
    capped |= at_ceiling;
    fmt::print("    {:<38} {:>+7.2f} % / {:>+7.2f} %{}  {:>5.2f}\n", one.what, 100 * (one.lower_s / base - 1),
               100 * (one.higher_s / base - 1), at_ceiling ? "*" : " ", one.elasticity());
  }
  if (capped) fmt::print("    * higher only up to the datasheet's rate (the share is taken over what was applied)\n");
}

void run(const SimCommandOptions& o) {
  require_a_run_to_price(o.request.usd_per_gpu_hour > 0, !o.request.train_tokens.empty());
  const model::Scenario scenario = load_scenario(o.scenario);
  require_outputs_before_work({{"--json", o.json_path}, {"--trace", o.trace_path}, {"--svg", o.svg_path}},
                              {scenario_input(o.scenario), {"--profile", o.request.profile},
                               {"cluster.gpu_profile", scenario.cluster.gpu_profile}});
  api::SimRequest request = o.request;
  request.isolate = false;  // one simulation in this process (more, in children, where the request needs them)
  request.progress = !o.quiet;
  request.trace = !o.trace_path.empty();
  const api::Simulation s = api::simulate(scenario, request);
  print_prediction(s);
  print_provenance(s, request);
  print_sensitivities(s, request);
  if (!o.json_path.empty()) {
    write_file_atomically(o.json_path, api::sim_document(s, request).dump(2) + "\n");
    fmt::print("  summary written to {}\n", o.json_path);
  }
  if (!o.trace_path.empty()) {
    write_file_atomically(o.trace_path, report::chrome_trace(s.program, s.result.timeline, s.traced_ranks));
    fmt::print("  trace written to {} (open in https://ui.perfetto.dev)\n", o.trace_path);
  }
  if (!o.svg_path.empty()) {
    write_file_atomically(o.svg_path, report::pipeline_svg(s.program, s.result.timeline));
    fmt::print("  pipeline diagram written to {}\n", o.svg_path);
  }
}

}  // namespace

void register_sim_command(CLI::App& app) {
  auto o = std::make_shared<SimCommandOptions>();
  CLI::App* command = app.add_subcommand("sim", "simulate one training iteration on a model of the cluster (SimGrid)");
  add_scenario_options(*command, o->scenario);
  command
      ->add_option("--fidelity", o->request.fidelity,
                   "rank: one actor per GPU, every collective as flows; group: one actor per TP group, TP "
                   "collectives analytical; replica: group fidelity for one pipeline replica, the others mirroring "
                   "it, every replica's collectives on the fabric; auto: group above 64 GPUs, replica above 512")
      ->check(CLI::IsMember({"auto", "rank", "group", "replica"}));
  command->add_option("--granularity", o->request.granularity, "layer (one op per layer and phase) or op (every kernel)")
      ->check(CLI::IsMember({"op", "layer"}));
  command->add_option("--gpu", o->request.gpu, "replace the scenario's GPU: a100, h100 or h200 (in its DGX node)")
      ->check(CLI::IsMember({"a100", "h100", "h200"}));
  command->add_option("--profile", o->request.profile,
                      "a hardware profile twin calibrate wrote (a cpu-host's rates, or a GPU's), in place of the "
                      "scenario's cluster.gpu_profile")
      ->check(CLI::ExistingFile);
  command->add_option("--placement", o->request.placement,
                      "rank to GPU order, innermost axis first (Megatron: tp-dp-pp; what-if: tp-pp-dp, dp-tp-pp, ...)");
  command
      ->add_option("--algorithm", o->request.algorithm,
                   "collective algorithm: auto (as NCCL), ring, tree, hierarchical, "
                   "analytical")
      ->check(CLI::IsMember({"auto", "ring", "tree", "hierarchical", "analytical"}));
  command->add_option("--oversubscription", o->request.oversubscription, "fat-tree leaf down:up ratio (1 = non-blocking)")
      ->check(between(1, 64));
  command->add_flag("--rail-optimized", o->request.rail_optimized, "rail-optimized fabric (a scalable unit under one leaf)");
  command->add_flag("--ideal-network", o->request.ideal_network, "infinite bandwidth and zero latency (the schedule alone)");
  command->add_option("--json", o->json_path, "write the summary as JSON")->check(output_file());
  command->add_option("--trace", o->trace_path, "write a Chrome trace (Perfetto) of the recorded ranks")
      ->check(output_file());
  command
      ->add_option("--trace-ranks", o->request.trace_ranks,
                   "ranks to trace, e.g. 0,8,16-23 (default: dp 0, tp 0 of every stage)")
      ->needs("--trace");
  command
      ->add_flag("--large-trace", o->request.large_trace,
                 "write a trace estimated past 200 MB (refused without it: say so before simulating)")
      ->needs("--trace");
  command->add_option("--svg", o->svg_path, "write a pipeline diagram of the iteration (SVG)")->check(output_file());
  command->add_flag("--quiet", o->quiet, "no progress line");
  command
      ->add_option(
          "--sensitivity", o->request.sensitivity_percent,
          "also simulate each rate of the hardware model (GEMM, HBM, attention GEMMs, kernel launches, NVLink, "
          "network) this many percent lower and higher (e.g. 10), and report how the iteration time moves")
      ->check(between(1, 50));
  command
      ->add_option("--train-tokens", o->request.train_tokens,
                   "also estimate a whole training run of this many tokens (300e9, 300B, 1.4T): iterations, days, "
                   "GPU-hours")
      ->check(token_count("--train-tokens"));
  command
      ->add_option("--usd-per-gpu-hour", o->request.usd_per_gpu_hour,
                   "with --train-tokens: the run's GPU-hours priced at this many dollars per GPU-hour (e.g. 2.5)")
      ->check(between(0.001, 1000));
  command->add_option("--slow-gpu", o->request.slow_gpus,
                      "RANK:FACTOR: that GPU's compute takes FACTOR times as long (repeatable); the report says where "
                      "the time went against the healthy run");
  command->add_option("--slow-gpu-fraction", o->request.slow_gpu_fraction,
                      "a fraction of the GPUs, drawn with --seed, each slowed by --slow-gpu-factor")
      ->check(between(0, 1));
  command->add_option("--slow-gpu-factor", o->request.slow_gpu_factor, "the slowdown of --slow-gpu-fraction's GPUs (1.5)")
      ->check(between(1, 100))
      ->needs("--slow-gpu-fraction");
  command->add_option("--seed", o->request.seed, "the draw of --slow-gpu-fraction (default 1)")->needs("--slow-gpu-fraction");
  command->add_option("--slow-link", o->request.slow_links,
                      "nic:RANK:FACTOR, nvlink:RANK:FACTOR or uplink:LEAF:SPINE:FACTOR: that link at FACTOR of its "
                      "bandwidth (repeatable)");
  command->add_option("--failed-uplink", o->request.failed_uplinks,
                      "LEAF:SPINE: that leaf's up-link failed, its traffic rerouted over the leaf's other up-links "
                      "(repeatable)");
  command->add_flag("--goodput", o->request.goodput,
                    "also the goodput at this iteration time: interruptions, checkpoints and restarts by the "
                    "scenario's failure model (twin goodput)");
  command->callback([o] { run(*o); });
}

}  // namespace twin::cli

// twin search SCENARIO: which parallel plan trains this model fastest on this cluster?
// Enumerates the plans that are valid and fit in GPU memory (tp, pp, micro-batch, schedule and chunks; for a
// Mixture-of-Experts model the expert-parallel size ep, and with --vary-etp the expert tensor-parallel size; the
// model, cluster and global batch stay), simulates each with `twin sim` in its own process (--jobs at a time: SimGrid
// is sequential, so a search fans out over cores), and ranks them by iteration time.
#include <algorithm>
#include <limits>
#include <cstdio>
#include <optional>
#include <thread>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/simulation_pool.hpp"
#include "cli/simulation_ranks.hpp"
#include "model/plan/schedule.hpp"
#include "model/program/estimates.hpp"
#include "sim/cost_model.hpp"
#include "topology/hardware.hpp"
#include "topology/platform.hpp"

namespace twin::cli {
namespace {

struct SearchOptions {
  ScenarioOptions scenario;
  int max_plans = 48;
  bool all = false;  // --all: simulate every plan that fits, not only the first --max
  // --memory-headroom: what a plan must leave free of one GPU's memory to count as fitting (a share, "5%", or GiB).
  // None by default: the plans NVIDIA and Meta ran on 80 GB GPUs sit at 97.6 to 99.6 % of twin's estimate
  // (docs/accuracy.md, "Memory"), and a planner that rejects the plans that trained is wrong where it matters most.
  std::string memory_headroom = "0%";
  bool explain = false;  // --explain: list the plans not simulated, each with its reason
  int jobs = 0;  // 0: hardware threads
  bool vary_recompute = false;
  bool vary_sequence_parallel = false;
  bool vary_zero = false;
  bool vary_schedule = false;  // also ZB-H1 for every pipeline without chunks
  std::vector<std::string> nodes;  // --vary-node: node kinds to search over, the scenario's GPU count on each
  bool vary_etp = false;
  bool vary_cp = false;  // --vary-cp: context-parallel sizes 1, 2, 4, 8 (those the sequence allows)
  std::string json_path;
  std::string train_tokens;  // passed on to each `twin sim --train-tokens` (empty: not asked)
  std::string usd_per_gpu_hour;  // passed on to each `twin sim --usd-per-gpu-hour` (empty: not asked)
  bool goodput = false;      // --goodput: rank by iteration time over goodput (the scenario's failure model)
  bool quiet = false;        // nothing on stderr but errors
};

struct Plan {
  std::int64_t tp, pp, dp, micro_batch, chunks;
  model::ScheduleKind schedule;
  model::Recompute recompute;
  std::int64_t recompute_layers = 0;  // parallel.recompute_num_layers: block recompute of full; 0: every layer
  bool sequence_parallel = false;
  std::int64_t zero_stage = 0;
  bool overlap_param_gather = false;  // the scenario's, kept where it applies (ZeRO-1)
  bool moe = false;                   // the model has experts: ep and etp are part of the plan
  std::int64_t ep = 1, etp = 1;
  std::int64_t cp = 1;  // context parallelism: dp = GPUs / (tp x cp x pp)
  double ideal_bubble = 0;
  double peak_memory_bytes = 0;
  // Filled by the simulation.
  std::string error;
  bool fits = false;  // its summary's memory.fits: the plan's peak within one GPU
  double iteration_time_s = 0, tflops_per_gpu = 0, bubble_fraction = 0;
  nlohmann::json training;  // with --train-tokens: the child's `training` summary
  nlohmann::json time_split = nlohmann::json::object();  // the child's `time_split`
  nlohmann::json goodput;   // with --goodput: the child's `goodput` summary
  double goodput_fraction = 1;
  // What ranks plans: the iteration time, over the goodput with --goodput (wall time per iteration of useful work).
  double effective_time_s() const { return iteration_time_s / goodput_fraction; }
  std::size_t target = 0;   // the SearchTarget (node kind) it runs on

  std::vector<std::string> overrides() const {
    std::vector<std::string> sets{fmt::format("parallel.tp={}", tp),
                                  fmt::format("parallel.pp={}", pp),
                                  fmt::format("parallel.dp={}", dp),
                                  fmt::format("parallel.cp={}", cp),
                                  fmt::format("parallel.micro_batch={}", micro_batch),
                                  fmt::format("parallel.schedule={}", model::to_string(schedule)),
                                  fmt::format("parallel.virtual_stages={}", chunks),
                                  fmt::format("parallel.recompute={}", model::to_string(recompute)),
                                  fmt::format("parallel.recompute_num_layers={}", recompute_layers),
                                  fmt::format("parallel.sequence_parallel={}", sequence_parallel),
                                  fmt::format("parallel.zero_stage={}", zero_stage),
                                  fmt::format("parallel.overlap_param_gather={}", overlap_param_gather)};
    if (moe) {
      sets.push_back(fmt::format("parallel.ep={}", ep));
      sets.push_back(fmt::format("parallel.etp={}", etp));
    }
    return sets;
  }
  // The sharding column: sequence parallelism and the ZeRO stage, "-" for neither.
  std::string sharding_label() const {
    std::string out = sequence_parallel ? "sp" : "";
    if (zero_stage > 0) out += fmt::format("{}zero{}", out.empty() ? "" : " ", zero_stage);
    return out.empty() ? "-" : out;
  }
  // The recompute column: none, selective, full, or "block N" (the first N layers of each chunk).
  std::string recompute_label() const {
    return recompute_layers > 0 ? fmt::format("block {}", recompute_layers) : std::string(model::to_string(recompute));
  }
  // The expert columns of an MoE plan: "ep 8" or "ep 8 etp 2"; empty for a dense model.
  std::string expert_label() const {
    if (!moe) return "";
    return etp > 1 ? fmt::format("ep {} etp {}", ep, etp) : fmt::format("ep {}", ep);
  }
  std::string label() const {
    return fmt::format("tp {} pp {} dp {}{}{} mb {} {}{} recompute {} {}", tp, pp, dp,
                       cp > 1 ? fmt::format(" cp {}", cp) : "", moe ? " " + expert_label() : "",
                       micro_batch, model::to_string(schedule), chunks > 1 ? fmt::format(" v{}", chunks) : "",
                       recompute_label(), sharding_label());
  }
};

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// The (ep, etp) pairs worth trying: for a Mixture-of-Experts model every ep that divides the experts, with etp = 1 or
// (vary_etp) every power of two up to a node's GPUs; validation keeps what Megatron-Core allows (ep x etp dividing
// tp x dp, model/plan/ranks.hpp). A dense model keeps its (1, 1).
std::vector<std::pair<std::int64_t, std::int64_t>> expert_plans(const model::Scenario& base, bool vary_etp) {
  if (!base.model.is_moe()) return {{base.parallel.ep, base.parallel.etp}};
  std::vector<std::int64_t> etps{1};
  if (vary_etp) {
    for (std::int64_t etp = 2; etp <= base.cluster.gpus_per_node; etp *= 2) etps.push_back(etp);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const std::int64_t ep : divisors(base.model.experts)) {
    for (const std::int64_t etp : etps) out.emplace_back(ep, etp);
  }
  return out;
}

// Pipeline sizes worth trying: those that split the layers evenly, or, when the scenario gives its end stages their
// own layer counts (parallel.first_stage_layers / last_stage_layers), any pipeline (the validation keeps those whose
// remaining layers split evenly over the other stages).
std::vector<std::int64_t> pipeline_sizes(const model::Scenario& base) {
  const auto& p = base.parallel;
  if (p.first_stage_layers <= 0 && p.last_stage_layers <= 0) return divisors(base.model.layers);
  std::vector<std::int64_t> out;
  for (std::int64_t pp = 2; pp <= base.model.layers; ++pp) out.push_back(pp);
  return out;
}

// The block recomputes (parallel.recompute_num_layers) worth trying on a plan with full recompute: a quarter, half and
// three quarters of its longest chunk's layers, each recomputing fewer layers than full recompute does.
std::vector<std::int64_t> block_recompute_layers(const model::Scenario& s) {
  std::int64_t longest = 0;
  for (std::int64_t vs = 0; vs < s.parallel.pp * s.parallel.virtual_stages; ++vs) {
    longest = std::max(longest, s.layers_in_virtual_stage(vs));
  }
  std::vector<std::int64_t> out;
  for (const std::int64_t quarters : {1, 2, 3}) {
    const std::int64_t layers = (longest * quarters + 2) / 4;
    const bool fresh = std::find(out.begin(), out.end(), layers) == out.end();
    if (layers >= 1 && layers < longest && fresh) out.push_back(layers);
  }
  return out;
}

// A plan the enumeration left out, with why: the first rule it breaks, or the memory it needs.
struct Rejection {
  std::string plan;
  std::string reason;
  bool memory = false;
};

// What --memory-headroom leaves free of a GPU of `capacity_bytes`: "N%" of it, or N GiB ("N" or "NGiB").
double headroom_bytes(const std::string& text, double capacity_bytes) {
  const bool percent = !text.empty() && text.back() == '%';
  std::string number = percent ? text.substr(0, text.size() - 1) : text;
  if (!percent && number.size() > 3 && number.compare(number.size() - 3, 3, "GiB") == 0) {
    number.resize(number.size() - 3);
  }
  double value = -1;
  try {
    std::size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) value = -1;
  } catch (const std::exception&) {
    value = -1;
  }
  const double bytes = percent ? capacity_bytes * value / 100 : value * 1024 * 1024 * 1024;
  if (!(value >= 0) || !(bytes < capacity_bytes)) {
    throw UserError(fmt::format("--memory-headroom {}: give a share of one GPU's memory under 100 % (\"5%\") or "
                                "GiB under its {:.0f} GiB (\"4\", \"4GiB\")",
                                text, capacity_bytes / (1024.0 * 1024 * 1024)));
  }
  return bytes;
}

// `s` as a plan, when it is valid and fits within the headroom; otherwise, with `rejections`, why not.
void add_plan_if_it_fits(const model::Scenario& s, const SearchOptions& o, std::vector<Plan>& plans,
                         int& rejected_for_memory, std::vector<Rejection>* rejections) {
  const auto& p = s.parallel;
  Plan plan{p.tp, p.pp, p.dp, p.micro_batch, p.virtual_stages, p.schedule, p.recompute, p.recompute_num_layers};
  plan.sequence_parallel = p.sequence_parallel;
  plan.zero_stage = p.zero_stage;
  plan.overlap_param_gather = p.overlap_param_gather;
  plan.moe = s.model.is_moe();
  plan.ep = p.ep;
  plan.etp = p.etp;
  plan.cp = p.cp;
  if (const std::vector<std::string> problems = model::validation_problems(s); !problems.empty()) {
    if (rejections) {
      std::string reason = problems.front();  // without the scenario's name: every line would repeat it
      if (reason.rfind(s.source + ": ", 0) == 0) reason.erase(0, s.source.size() + 2);
      rejections->push_back({plan.label(), reason, false});
    }
    return;
  }
  const auto memory = model::estimate_memory(s);
  const double headroom = headroom_bytes(o.memory_headroom, memory.capacity_bytes);
  if (memory.peak_bytes > memory.capacity_bytes - headroom) {
    ++rejected_for_memory;
    const double gib = 1024.0 * 1024 * 1024;
    if (rejections) {
      rejections->push_back({plan.label(),
                             fmt::format("needs {:.1f} GiB of {:.0f} GiB, over the {:.1f} GiB the headroom leaves",
                                         memory.peak_bytes / gib, memory.capacity_bytes / gib,
                                         (memory.capacity_bytes - headroom) / gib),
                             true});
    }
    return;
  }
  plan.ideal_bubble = model::ideal_bubble_fraction(p);
  plan.peak_memory_bytes = memory.peak_bytes;
  plans.push_back(plan);
}

// The schedules a plan with `pp` stages and `chunks` chunks per stage runs: the interleaved one with chunks, else the
// base's (1F1B where it cannot apply: the base's interleaved, or ZB-H1 without a pipeline), and with vary_schedule
// ZB-H1 too where there is a pipeline.
std::vector<model::ScheduleKind> schedules_of(const model::Scenario& base, std::int64_t pp, std::int64_t chunks,
                                              bool vary_schedule) {
  using model::ScheduleKind;
  if (chunks > 1) return {ScheduleKind::Interleaved};
  ScheduleKind own = base.parallel.schedule;
  if (own == ScheduleKind::Interleaved) own = ScheduleKind::OneFOneB;
  if (pp == 1 && own == ScheduleKind::ZeroBubbleH1) own = ScheduleKind::OneFOneB;
  std::vector<ScheduleKind> out{own};
  if (vary_schedule && pp > 1 && own != ScheduleKind::ZeroBubbleH1) out.push_back(ScheduleKind::ZeroBubbleH1);
  return out;
}

// Every valid plan that fits, ordered by its ideal bubble (then less tensor parallelism): the order in which they are
// simulated when there are more than --max. With vary_recompute, every recompute mode, block recompute included; with
// vary_sequence_parallel, with and without it (where tp > 1); with vary_zero, ZeRO stages 0 and 1; with vary_schedule,
// ZB-H1 beside 1F1B (schedules_of).
std::vector<Plan> enumerate_plans(const model::Scenario& base, const SearchOptions& o, int& rejected_for_memory,
                                  std::vector<Rejection>* rejections) {
  const bool vary_recompute = o.vary_recompute;
  std::vector<model::Recompute> recomputes{base.parallel.recompute};
  if (vary_recompute) recomputes = {model::Recompute::None, model::Recompute::Selective, model::Recompute::Full};
  std::vector<bool> sequence_parallels{base.parallel.sequence_parallel};
  if (o.vary_sequence_parallel) sequence_parallels = {false, true};
  std::vector<std::int64_t> zero_stages{base.parallel.zero_stage};
  if (o.vary_zero) zero_stages = {0, 1};
  const std::int64_t gpus = base.cluster.total_gpus();
  const auto experts = expert_plans(base, o.vary_etp);
  // Context parallelism takes its share of the GPUs before data parallelism does (Megatron-Core's rank grid): the
  // scenario's cp, or with --vary-cp each of 1, 2, 4, 8 (validation keeps those the sequence length allows).
  const std::vector<std::int64_t> cps = o.vary_cp ? std::vector<std::int64_t>{1, 2, 4, 8}
                                                  : std::vector<std::int64_t>{base.parallel.cp};
  const auto recompute_and_schedule = [&](std::int64_t pp, std::int64_t chunks) {
    std::vector<std::pair<model::Recompute, model::ScheduleKind>> out;
    for (const model::Recompute recompute : recomputes) {
      for (const model::ScheduleKind schedule : schedules_of(base, pp, chunks, o.vary_schedule)) {
        out.emplace_back(recompute, schedule);
      }
    }
    return out;
  };
  std::vector<Plan> plans;
  rejected_for_memory = 0;
  for (std::int64_t tp = 1; tp <= base.cluster.gpus_per_node; tp *= 2) {
    for (std::int64_t pp : pipeline_sizes(base)) {
     for (const std::int64_t cp : cps) {
      if (gpus % (tp * pp * cp) != 0) continue;
      const std::int64_t dp = gpus / (tp * pp * cp);
      for (std::int64_t micro_batch : {1, 2, 4, 8}) {
        for (std::int64_t chunks = 1; chunks <= 4; ++chunks) {
          for (const auto& [recompute, schedule] : recompute_and_schedule(pp, chunks)) {
            model::Scenario s = base;
            s.parallel.tp = tp;
            s.parallel.pp = pp;
            s.parallel.dp = dp;
            s.parallel.cp = cp;
            s.parallel.micro_batch = micro_batch;
            s.parallel.virtual_stages = chunks;
            s.parallel.schedule = schedule;
            s.parallel.recompute = recompute;
            // Block recompute belongs to full recompute: the base's own, then (varying) a few more.
            const bool full = recompute == model::Recompute::Full;
            std::vector<std::int64_t> blocks{full ? base.parallel.recompute_num_layers : 0};
            if (vary_recompute && full && base.framework.name != model::Framework::DeepSpeed) {
              for (const std::int64_t layers : block_recompute_layers(s)) {
                if (layers != blocks.front()) blocks.push_back(layers);
              }
            }
            for (const std::int64_t block : blocks) {
              s.parallel.recompute_num_layers = block;
              // Without TP there is nothing to split: sequence parallelism is off, once.
              for (const bool sequence_parallel : tp == 1 ? std::vector<bool>{false} : sequence_parallels) {
                s.parallel.sequence_parallel = sequence_parallel;
                for (const std::int64_t zero_stage : zero_stages) {
                  s.parallel.zero_stage = zero_stage;
                  // --overlap-param-gather belongs to the distributed optimizer: a ZeRO-0 variant goes without it.
                  s.parallel.overlap_param_gather = base.parallel.overlap_param_gather && zero_stage == 1;
                  for (const auto& [ep, etp] : experts) {
                    s.parallel.ep = ep;
                    s.parallel.etp = etp;
                    add_plan_if_it_fits(s, o, plans, rejected_for_memory, rejections);
                  }
                }
              }
            }
          }
        }
      }
     }
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
    if (a.ideal_bubble != b.ideal_bubble) return a.ideal_bubble < b.ideal_bubble;
    return a.tp < b.tp;
  });
  return plans;
}

// One cluster a search runs on: the scenario's, or with --vary-node each node kind holding the scenario's GPUs.
struct SearchTarget {
  ScenarioOptions options;  // the user's, plus cluster.node / gpus_per_node / nodes for a varied node
  model::Scenario base;
};

void check_searchable(const model::Scenario& base, const SearchOptions& o) {
  if (base.cluster.node == model::NodeKind::CpuHost) {
    throw UserError("twin search simulates GPU clusters; this scenario runs on CPU hosts (cluster.node = cpu-host)");
  }
  try {  // the cluster's own GPU measurements: refused once here rather than in every plan's simulation
    sim::analytical_parameters(topology::node_spec(base.cluster.node).gpu, base.cluster);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", base.source, error.what()));
  }
  if (o.vary_zero && base.framework.name == model::Framework::Composer) {
    throw UserError(
        "--vary-zero tries ZeRO stages 0 and 1 (Megatron-LM's distributed optimizer, DeepSpeed's ZeRO-1); "
        "framework.name = \"composer\" shards with FSDP (zero_stage = 3)");
  }
}

// The node kind named `name` as a scenario spells it (cluster.node), if any.
std::optional<model::NodeKind> node_kind(const std::string& name) {
  // Every kind: CpuHost is the enumeration's last (model/scenario/scenario.hpp).
  for (int k = 0; k <= static_cast<int>(model::NodeKind::CpuHost); ++k) {
    const auto kind = static_cast<model::NodeKind>(k);
    if (model::to_string(kind) == name) return kind;
  }
  return std::nullopt;
}

// --vary-node: the same number of GPUs in whole nodes of each kind (its GPUs per node from model/'s node table).
std::vector<SearchTarget> search_targets(const SearchOptions& o) {
  const model::Scenario scenario = load_scenario(o.scenario);
  require_outputs_before_work({{"--json", o.json_path}}, {scenario_input(o.scenario)});
  if (o.nodes.empty()) return {{o.scenario, scenario}};
  const std::int64_t gpus = scenario.cluster.total_gpus();
  std::vector<SearchTarget> targets;
  for (const std::string& name : o.nodes) {
    ScenarioOptions options = o.scenario;
    options.sets.push_back("cluster.node=" + name);
    const std::optional<model::NodeKind> node = node_kind(name);
    if (!node) {
      load_scenario(options);  // the loader's error names the key and lists the node kinds
      throw UserError(fmt::format("--vary-node: no node kind '{}'", name));
    }
    const std::int64_t per_node = model::default_gpus_per_node(node.value());
    if (gpus % per_node != 0) {
      throw UserError(fmt::format("--vary-node {}: the scenario's {} GPUs do not fill whole nodes of {} GPUs", name,
                                  gpus, per_node));
    }
    options.sets.push_back(fmt::format("cluster.gpus_per_node={}", per_node));
    options.sets.push_back(fmt::format("cluster.nodes={}", gpus / per_node));
    targets.push_back({options, load_scenario(options)});
  }
  return targets;
}

// "12 plans simulated" or "48 of 87 plans that fit simulated (--max 48, ...)": the cap, said where it cut.
std::string simulated_line(std::size_t simulated, std::size_t found, const SearchOptions& o) {
  if (simulated == found) return fmt::format("{} plans simulated (every plan that fits)", simulated);
  return fmt::format("{} of {} plans that fit simulated (--max {}, smallest ideal bubble first; --all for every one)",
                     simulated, found, o.max_plans);
}

// --explain: the plans left out, with their reasons (memory first, then the rules they break).
void print_rejections(const std::vector<Rejection>& rejections) {
  if (rejections.empty()) return;
  fmt::print("\nnot simulated ({} plans):\n", rejections.size());
  for (const bool memory : {true, false}) {
    for (const Rejection& r : rejections) {
      if (r.memory == memory) fmt::print("  {}: {}\n", r.plan, r.reason);
    }
  }
}

void run_search(const SearchOptions& o) {
  const std::vector<SearchTarget> targets = search_targets(o);
  const model::Scenario& base = targets.front().base;
  int rejected_for_memory = 0;
  std::vector<std::vector<Plan>> per_target;
  std::vector<Rejection> rejections;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    check_searchable(targets[t].base, o);
    headroom_bytes(o.memory_headroom, model::estimate_memory(targets[t].base).capacity_bytes);  // refused before work
    int rejected = 0;
    per_target.push_back(enumerate_plans(targets[t].base, o, rejected, o.explain ? &rejections : nullptr));
    for (Plan& plan : per_target.back()) plan.target = t;
    rejected_for_memory += rejected;
  }
  // Each target's plans in turn, then by ideal bubble: a --max cut keeps every node kind's best plans.
  std::vector<Plan> plans;
  for (std::size_t i = 0, added = 1; added > 0; ++i) {
    added = 0;
    for (const std::vector<Plan>& list : per_target) {
      if (i >= list.size()) continue;
      plans.push_back(list[i]);
      ++added;
    }
  }
  std::stable_sort(plans.begin(), plans.end(),
                   [](const Plan& a, const Plan& b) { return a.ideal_bubble < b.ideal_bubble; });
  const std::size_t found = plans.size();
  if (plans.empty()) {
    print_rejections(rejections);
    throw UserError(fmt::format("no valid plan of {} fits {} x {} GPUs ({} rejected for memory with --memory-headroom "
                                "{}{})",
                                base.model.name, base.cluster.nodes, base.cluster.gpus_per_node, rejected_for_memory,
                                o.memory_headroom, o.explain ? "" : "; --explain lists every plan with its reason"));
  }
  if (!o.all && plans.size() > static_cast<std::size_t>(o.max_plans)) plans.resize(o.max_plans);
  const int jobs = o.jobs > 0 ? o.jobs : default_jobs();
  const bool quiet = o.quiet || launched_rank().rank != 0;  // under mpirun / srun rank 0 speaks for all
  if (!quiet) {
    fmt::print(stderr, "twin search: {} plans of {} fit {} GPUs ({} rejected for memory); simulating {} with {} jobs\n",
               found, base.model.name, base.cluster.total_gpus(), rejected_for_memory, plans.size(), jobs);
    // Each plan's simulation builds the platform again: on thousands of nodes that dominates, so say what it costs.
    double build_s = 0;
    for (const Plan& plan : plans) build_s += topology::estimated_build_seconds(static_cast<int>(
        std::min<std::int64_t>(targets[plan.target].base.cluster.nodes, std::numeric_limits<int>::max())));
    if (build_s / jobs > 10) {
      fmt::print(stderr,
                 "twin search: building the platforms alone takes about {} ({} plans on {} nodes, {} at a time, on a "
                 "2-core machine; it grows with the square of the nodes), then each replay\n",
                 build_s / jobs >= 3600 ? fmt::format("{:.1f} h", build_s / jobs / 3600)
                                        : fmt::format("{:.0f} min", std::max(1.0, build_s / jobs / 60)),
                 plans.size(), base.cluster.nodes, jobs);
    }
  }

  const std::string scenario_path = resolve_scenario_path(o.scenario.scenario);
  std::vector<std::vector<std::string>> override_lists;
  for (const Plan& plan : plans) {
    std::vector<std::string> sets = as_sets(scenario_overrides(targets[plan.target].options));
    for (const auto& set : plan.overrides()) sets.push_back(set);
    override_lists.push_back(std::move(sets));
  }
  const std::vector<std::string> extra = child_sim_arguments(o.train_tokens, o.usd_per_gpu_hour, o.goodput);
  const std::optional<std::vector<SimulationOutcome>> gathered =
      simulate_across_ranks(scenario_path, override_lists, jobs, "search", extra, !quiet);
  if (!gathered) return;  // a rank other than 0 of an MPI job: rank 0 has its outcomes
  const std::vector<SimulationOutcome>& outcomes = *gathered;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    Plan& plan = plans[i];
    plan.error = outcomes[i].error;
    if (!plan.error.empty()) continue;
    plan.iteration_time_s = outcomes[i].summary.at("iteration_time_s").get<double>();
    plan.tflops_per_gpu = outcomes[i].summary.at("tflops_per_gpu").get<double>();
    plan.bubble_fraction = outcomes[i].summary.at("bubble_fraction").get<double>();
    plan.fits = outcomes[i].summary.at("memory").at("fits").get<bool>();
    plan.time_split = outcomes[i].summary.value("time_split", nlohmann::json::object());
    if (!o.train_tokens.empty()) plan.training = outcomes[i].summary.at("training");
    if (o.goodput) {
      plan.goodput = outcomes[i].summary.at("goodput");
      plan.goodput_fraction = plan.goodput.at("goodput_fraction").get<double>();
    }
  }

  std::stable_sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
    if (a.error.empty() != b.error.empty()) return a.error.empty();
    return a.effective_time_s() < b.effective_time_s();
  });
  const bool varied = !o.nodes.empty();
  const char* order = o.goodput ? "most useful work per wall-clock second first (iteration time over goodput)"
                                : "fastest first";
  if (varied) {
    std::string kinds;
    for (const SearchTarget& target : targets) {
      kinds += fmt::format("{}{} x {}", kinds.empty() ? "" : ", ", target.base.cluster.nodes,
                           model::to_string(target.base.cluster.node));
    }
    fmt::print("{} on {} GPUs of {}, {}, global batch {}: {}, {}\n\n", base.model.name,
               base.cluster.total_gpus(), kinds, model::precision_label(base), base.parallel.global_batch,
               simulated_line(plans.size(), found, o), order);
  } else {
    fmt::print("{} on {} x {} ({} GPUs), {}, global batch {}: {}, {}\n\n", base.model.name,
               base.cluster.nodes, model::to_string(base.cluster.node), base.cluster.total_gpus(),
               model::precision_label(base), base.parallel.global_batch, simulated_line(plans.size(), found, o),
               order);
  }
  const bool training = !o.train_tokens.empty();
  auto node_column = [&](const Plan& plan) {
    return varied ? fmt::format("  {:<12}", model::to_string(targets[plan.target].base.cluster.node)) : std::string();
  };
  // An MoE model's plans have two more columns, ep and etp, after dp.
  const bool moe = base.model.is_moe();
  const bool context = o.vary_cp || base.parallel.cp > 1;  // a cp column after dp
  auto experts = [moe, context](const Plan& plan) {
    return fmt::format("{}{}", context ? fmt::format(" {:>3}", plan.cp) : "",
                       moe ? fmt::format(" {:>4} {:>4}", plan.ep, plan.etp) : "");
  };
  fmt::print("{}  {:>4} {:>4} {:>5}{} {:>4}  {:<16} {:<10} {:<8} {:>10} {:>9} {:>8} {:>9} {:>5}{}\n",
             varied ? fmt::format("  {:<12}", "node") : "", "tp", "pp", "dp",
             fmt::format("{}{}", context ? fmt::format(" {:>3}", "cp") : "",
                         moe ? fmt::format(" {:>4} {:>4}", "ep", "etp") : ""),
             "mb", "schedule", "recompute", "sharding", "iter s", "TFLOP/s", "bubble", "mem GiB", "fits",
             fmt::format("{}{}", o.goodput ? fmt::format(" {:>8}", "goodput") : "",
                         training ? fmt::format(" {:>9} {:>12}", "days", "GPU-hours") : ""));
  nlohmann::json results = nlohmann::json::array();
  for (const Plan& plan : plans) {
    const std::string schedule =
        fmt::format("{}{}", model::to_string(plan.schedule), plan.chunks > 1 ? fmt::format(" v={}", plan.chunks) : "");
    const double gib = plan.peak_memory_bytes / (1024.0 * 1024 * 1024);
    if (plan.error.empty()) {
      // With --goodput the days count failures (and the GPU-hours the wall time they cost).
      const double days = training ? plan.training.value(o.goodput ? "days_with_failures" : "days", 0.0) : 0;
      const std::string training_columns = fmt::format(
          "{}{}", o.goodput ? fmt::format(" {:>7.1f}%", 100 * plan.goodput_fraction) : "",
          training ? fmt::format(" {:>9.1f} {:>12.0f}", days,
                                 plan.training.at("gpu_hours").get<double>() / plan.goodput_fraction)
                   : "");
      fmt::print("{}  {:>4} {:>4} {:>5}{} {:>4}  {:<16} {:<10} {:<8} {:>10.3f} {:>9.1f} {:>7.1f}% {:>9.1f} {:>5}{}\n",
                 node_column(plan), plan.tp, plan.pp, plan.dp, experts(plan), plan.micro_batch, schedule,
                 plan.recompute_label(), plan.sharding_label(), plan.iteration_time_s, plan.tflops_per_gpu,
                 100 * plan.bubble_fraction, gib, plan.fits ? "yes" : "NO", training_columns);
    } else {
      fmt::print("{}  {:>4} {:>4} {:>5}{} {:>4}  {:<16} {:<10} {:<8} failed: {}\n", node_column(plan), plan.tp, plan.pp,
                 plan.dp, experts(plan), plan.micro_batch, schedule, plan.recompute_label(), plan.sharding_label(),
                 plan.error);
    }
    const model::ClusterSpec& cluster = targets[plan.target].base.cluster;
    results.push_back({{"node", model::to_string(cluster.node)},
                       {"nodes", cluster.nodes},
                       {"tp", plan.tp},
                       {"pp", plan.pp},
                       {"dp", plan.dp},
                       {"cp", plan.cp},
                       {"ep", plan.ep},
                       {"etp", plan.etp},
                       {"micro_batch", plan.micro_batch},
                       {"schedule", model::to_string(plan.schedule)},
                       {"virtual_stages", plan.chunks},
                       {"recompute", model::to_string(plan.recompute)},
                       {"recompute_num_layers", plan.recompute_layers},
                       {"sequence_parallel", plan.sequence_parallel},
                       {"zero_stage", plan.zero_stage},
                       {"overlap_param_gather", plan.overlap_param_gather},
                       {"memory_per_gpu_bytes", plan.peak_memory_bytes},
                       {"fits", plan.fits},
                       {"iteration_time_s", plan.iteration_time_s},
                       {"tflops_per_gpu", plan.tflops_per_gpu},
                       {"bubble_fraction", plan.bubble_fraction},
                       {"time_split", plan.time_split},
                       {"error", plan.error}});
    if (training && plan.error.empty()) results.back()["training"] = plan.training;
    if (o.goodput && plan.error.empty()) results.back()["goodput"] = plan.goodput;
  }
  print_rejections(rejections);
  if (!o.json_path.empty()) {
    nlohmann::json document{{"scenario", base.model.name},
                            {"plans", results},
                            {"plans_that_fit", found},
                            {"rejected_for_memory", rejected_for_memory},
                            {"memory_headroom", o.memory_headroom}};
    if (o.explain) {
      nlohmann::json rejected = nlohmann::json::array();
      for (const Rejection& r : rejections) {
        rejected.push_back({{"plan", r.plan}, {"reason", r.reason}, {"memory", r.memory}});
      }
      document["rejected"] = rejected;
    }
    write_file_atomically(o.json_path, document.dump(1) + "\n");
  }
}

}  // namespace

void register_search_command(CLI::App& app) {
  auto o = std::make_shared<SearchOptions>();
  CLI::App* command = app.add_subcommand(
      "search",
      "simulate every parallel plan (tp, pp, micro-batch, schedule) that fits and rank them by iteration time");
  add_scenario_options(*command, o->scenario);
  command
      ->add_option("--max", o->max_plans,
                   "simulate at most this many of the plans that fit, smallest ideal bubble first (default 48)")
      ->check(at_least(1));
  command->add_flag("--all", o->all, "simulate every plan that fits (no --max cap)");
  command->add_option("--memory-headroom", o->memory_headroom,
                      "memory a plan must leave free on each GPU to count as fitting: a share (\"5%\") or GiB "
                      "(\"4\"); default none, as the plans that really trained used up to 99.6 % of twin's estimate");
  command->add_flag("--explain", o->explain,
                    "list every plan not simulated with its reason (the rule it breaks, or the memory it needs)");
  command
      ->add_option("--jobs", o->jobs,
                   "simulations at a time on each host (default: one per core, shared among the MPI ranks on it)")
      ->check(between(1, 1024));
  command->add_flag("--vary-recompute", o->vary_recompute,
                    "also try recompute none, selective and full, and block recompute of a quarter, half and three "
                    "quarters of a chunk's layers (Megatron only)");
  command->add_flag("--vary-sequence-parallel", o->vary_sequence_parallel,
                    "also try each plan with tp > 1 with and without sequence parallelism");
  command->add_flag("--vary-zero", o->vary_zero,
                    "also try ZeRO stages 0 and 1 (Megatron-LM's distributed optimizer, DeepSpeed's ZeRO-1)");
  command->add_flag("--vary-schedule", o->vary_schedule,
                    "also try the zero-bubble ZB-H1 schedule for each pipeline without chunks (where it applies)");
  command
      ->add_option("--vary-node", o->nodes,
                   "also search these node kinds (e.g. dgx-h100,dgx-h200,gb200-nvl72), each with the scenario's "
                   "number of GPUs in whole nodes")
      ->delimiter(',');
  command->add_flag("--vary-cp", o->vary_cp,
                    "also try context parallelism 1, 2, 4 and 8 (dp = GPUs / (tp x cp x pp)); without it, the "
                    "scenario's parallel.cp is kept");
  command->add_flag("--vary-etp", o->vary_etp,
                    "Mixture-of-Experts: also try expert tensor parallelism (etp 2, 4, ... up to a node) with each ep");
  command->add_option("--json", o->json_path, "write every plan and its result as JSON")->check(output_file());
  command
      ->add_option("--usd-per-gpu-hour", o->usd_per_gpu_hour,
                   "with --train-tokens: each plan's GPU-hours priced at this many dollars per GPU-hour (JSON "
                   "training.cost_usd)")
      ->check(between(0.001, 1000));
  command
      ->add_option("--train-tokens", o->train_tokens,
                   "also estimate each plan's whole training run of this many tokens: days, GPU-hours")
      ->check(token_count("--train-tokens"));
  command->add_flag("--goodput", o->goodput,
                    "rank by iteration time over goodput (the scenario's failure model, twin goodput): a goodput "
                    "column, and --train-tokens days with failures");
  command->add_flag("--quiet", o->quiet, "no progress on stderr (errors still)");
  command->callback([o] { run_search(*o); });
}

}  // namespace twin::cli

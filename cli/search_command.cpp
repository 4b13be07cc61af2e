// twin search SCENARIO: which parallel plan trains this model fastest on this cluster?
// Enumerates the plans that are valid and fit in GPU memory (model/program/plan_space.hpp: tp, pp, micro-batch,
// schedule and chunks; for a Mixture-of-Experts model the expert-parallel size ep, and with --vary-etp the expert
// tensor-parallel size; the model, cluster and global batch stay), simulates them in order of a lower bound on their
// iteration time, each with `twin sim` in its own process (--jobs at a time: SimGrid is sequential, so a search fans
// out over cores), until the bound proves the --max fastest, and ranks them (api/search.hpp). Parse, call, print.
#include <algorithm>
#include <cstdio>
#include <thread>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "api/search.hpp"
#include "cli/commands.hpp"
#include "cli/simulation_pool.hpp"
#include "cli/simulation_ranks.hpp"
#include "cli/within_days.hpp"
#include "report/plan_tables.hpp"
#include "topology/platform.hpp"

namespace twin::cli {
namespace {

struct SearchOptions {
  ScenarioOptions scenario;
  int max_plans = 48;
  bool all = false;  // --all: simulate every plan that fits, not only until the bound proves the --max fastest
  model::PlanSpace space;  // the --vary-* flags and --memory-headroom
  bool explain = false;  // --explain: list the plans not simulated, each with its reason
  int jobs = 0;  // 0: hardware threads
  std::vector<std::string> nodes;  // --vary-node: node kinds to search over, the scenario's GPU count on each
  std::string json_path;
  std::string csv_path;  // --csv: the table, a line per plan
  std::string sort;      // --sort COLUMN: the table's order (empty: fastest first)
  std::string train_tokens;  // passed on to each `twin sim --train-tokens` (empty: not asked)
  std::string usd_per_gpu_hour;  // passed on to each `twin sim --usd-per-gpu-hour` (empty: not asked)
  bool goodput = false;      // --goodput: rank by iteration time over goodput (the scenario's failure model)
  double days = 0;           // --days: whether each plan finishes in time, and the fewest GPUs that do (0: not asked)
  bool quiet = false;        // nothing on stderr but errors
};

api::SearchRequest search_request(const SearchOptions& o) {
  api::SearchRequest request;
  request.scenario = o.scenario.scenario;
  request.sets = o.scenario.sets;
  request.overrides_of = [options = o.scenario](const std::vector<std::string>& extra_sets) {
    ScenarioOptions target = options;
    target.sets.insert(target.sets.end(), extra_sets.begin(), extra_sets.end());
    return scenario_overrides(target);
  };
  request.space = o.space;
  request.nodes = o.nodes;
  request.max_plans = o.max_plans;
  request.all = o.all;
  request.explain = o.explain;
  request.extras.train_tokens = o.train_tokens;
  request.extras.goodput = o.goodput;
  request.within_days = o.days;
  return request;
}

// Where the enumerated plans went, and what --max meant: "12 plans simulated (every plan that fits; ...)" or "60 of
// 870 plans that fit simulated (--max 48: the 48 fastest, proven by a lower bound ...; 2400 plans enumerated, ...)".
std::string simulated_line(const api::Search& search, const SearchOptions& o) {
  const std::string counts =
      fmt::format("{} plans enumerated, {} invalid, {} over memory, {} pruned by the bound, {} simulated",
                  search.enumerated, search.invalid, search.rejected_for_memory, search.pruned_by_bound,
                  search.simulated);
  if (search.simulated == search.found) {
    return fmt::format("{} plans simulated (every plan that fits; {})", search.simulated, counts);
  }
  return fmt::format("{} of {} plans that fit simulated (--max {}: the {} fastest, proven by a lower bound on each "
                     "plan not simulated; --all for every one; {})",
                     search.simulated, search.found, o.max_plans, o.max_plans, counts);
}

// --explain: the plans left out, with their reasons (memory first, then the rules they break).
void print_rejections(const std::vector<model::Rejection>& rejections) {
  if (rejections.empty()) return;
  fmt::print("\nnot simulated ({} plans):\n", rejections.size());
  for (const bool memory : {true, false}) {
    for (const model::Rejection& r : rejections) {
      if (r.memory == memory) fmt::print("  {}: {}\n", r.plan, r.reason);
    }
  }
}

// What the search is about to do, on stderr: plans found and how they will be simulated, and what building the
// platforms costs.
void print_start(const api::Search& search, const SearchOptions& o, int jobs) {
  const model::Scenario& base = search.targets.front().base;
  const std::size_t first = o.all ? search.found : std::min<std::size_t>(search.found, o.max_plans);
  fmt::print(stderr,
             "twin search: {} plans of {} enumerated on {} GPUs: {} invalid, {} over memory, {} fit; simulating {}, "
             "with {} jobs\n",
             search.enumerated, base.model.name, base.cluster.total_gpus(), search.invalid, search.rejected_for_memory,
             search.found,
             o.all ? "every one"
                   : fmt::format("in order of a lower bound on their iteration time until it proves the {} fastest "
                                 "(at least {})",
                                 first, first),
             jobs);
  // Each plan's simulation builds the platform again: on a hundred thousand nodes that adds up, so say what it costs
  // (at most: a host per GPU, as rank fidelity builds it).
  double build_s = 0;
  for (std::size_t i = 0; i < first; ++i) {
    const model::ClusterSpec& cluster = search.targets[search.plans[i].target].base.cluster;
    build_s += topology::estimated_build_seconds(cluster.nodes, cluster.gpus_per_node);
  }
  if (build_s / jobs > 10) {
    fmt::print(stderr,
               "twin search: building the platforms alone takes up to about {} ({} plans on {} nodes, {} at a time, on "
               "a 2-core machine; it grows with the hosts), then each replay\n",
               build_s / jobs >= 3600 ? fmt::format("{:.1f} h", build_s / jobs / 3600)
                                      : fmt::format("{:.0f} min", std::max(1.0, build_s / jobs / 60)),
               first, base.cluster.nodes, jobs);
  }
}

// The ranked plans' table.
void print_plans(const api::Search& search, const SearchOptions& o) {
  const auto& targets = search.targets;
  const model::Scenario& base = targets.front().base;
  const bool varied = !o.nodes.empty();
  const std::string order = !o.sort.empty() ? fmt::format("sorted by {} (--sort)", o.sort)
                            : o.goodput      ? "most useful work per wall-clock second first (iteration time over goodput)"
                                             : "fastest first";
  if (varied) {
    std::string kinds;
    for (const api::SearchTarget& target : targets) {
      kinds += fmt::format("{}{} x {}", kinds.empty() ? "" : ", ", target.base.cluster.nodes,
                           model::to_string(target.base.cluster.node));
    }
    fmt::print("{} on {} GPUs of {}, {}, global batch {}: {}, {}\n\n", base.model.name,
               base.cluster.total_gpus(), kinds, model::precision_label(base), base.parallel.global_batch,
               simulated_line(search, o), order);
  } else {
    fmt::print("{} on {} x {} ({} GPUs), {}, global batch {}: {}, {}\n\n", base.model.name,
               base.cluster.nodes, model::to_string(base.cluster.node), base.cluster.total_gpus(),
               model::precision_label(base), base.parallel.global_batch, simulated_line(search, o),
               order);
  }
  const bool training = !o.train_tokens.empty();
  auto node_column = [&](const api::SearchedPlan& plan) {
    return varied ? fmt::format("  {:<12}", model::to_string(targets[plan.target].base.cluster.node)) : std::string();
  };
  // An MoE model's plans have two more columns, ep and etp, after dp.
  const bool moe = base.model.is_moe();
  const bool context = o.space.vary_cp || base.parallel.cp > 1;  // a cp column after dp
  auto experts = [moe, context](const model::Plan& plan) {
    return fmt::format("{}{}", context ? fmt::format(" {:>3}", plan.cp) : "",
                       moe ? fmt::format(" {:>4} {:>4}", plan.ep, plan.etp) : "");
  };
  fmt::print("{}  {:>4} {:>4} {:>5}{} {:>4}  {:<16} {:<10} {:<8} {:>10} {:>9} {:>8} {:>9} {:>5}{}\n",
             varied ? fmt::format("  {:<12}", "node") : "", "tp", "pp", "dp",
             fmt::format("{}{}", context ? fmt::format(" {:>3}", "cp") : "",
                         moe ? fmt::format(" {:>4} {:>4}", "ep", "etp") : ""),
             "mb", "schedule", "recompute", "sharding", "iter s", "TFLOP/s", "bubble", "mem GiB", "fits",
             fmt::format("{}{}{}", o.goodput ? fmt::format(" {:>8}", "goodput") : "",
                         training ? fmt::format(" {:>9} {:>12}", "days", "GPU-hours") : "",
                         o.days > 0 ? fmt::format(" {:>8}", "finishes") : ""));
  for (const api::SearchedPlan& one : search.plans) {
    const model::Plan& plan = one.plan;
    const nlohmann::json& summary = one.outcome.summary;
    const std::string schedule =
        fmt::format("{}{}", model::to_string(plan.schedule), plan.chunks > 1 ? fmt::format(" v={}", plan.chunks) : "");
    const double gib = plan.peak_memory_bytes / (1024.0 * 1024 * 1024);
    if (one.outcome.error.empty()) {
      // With --goodput the days count failures (and the GPU-hours the wall time they cost).
      const double days = training ? summary.at("training").value(o.goodput ? "days_with_failures" : "days", 0.0) : 0;
      const std::string training_columns = fmt::format(
          "{}{}{}", o.goodput ? fmt::format(" {:>7.1f}%", 100 * one.goodput_fraction) : "",
          training ? fmt::format(" {:>9.1f} {:>12.0f}", days,
                                 summary.at("training").at("gpu_hours").get<double>() / one.goodput_fraction)
                   : "",
          o.days > 0 ? fmt::format(" {:>8}", days <= o.days ? "yes" : "no") : "");
      fmt::print("{}  {:>4} {:>4} {:>5}{} {:>4}  {:<16} {:<10} {:<8} {:>10.3f} {:>9.1f} {:>7.1f}% {:>9.1f} {:>5}{}\n",
                 node_column(one), plan.tp, plan.pp, plan.dp, experts(plan), plan.micro_batch, schedule,
                 plan.recompute_label(), plan.sharding_label(), one.iteration_time_s, summary.at("tflops_per_gpu").get<double>(),
                 100 * summary.at("bubble_fraction").get<double>(), gib,
                 summary.at("memory").at("fits").get<bool>() ? "yes" : "NO", training_columns);
    } else {
      fmt::print("{}  {:>4} {:>4} {:>5}{} {:>4}  {:<16} {:<10} {:<8} failed: {}\n", node_column(one), plan.tp, plan.pp,
                 plan.dp, experts(plan), plan.micro_batch, schedule, plan.recompute_label(), plan.sharding_label(),
                 one.outcome.error);
    }
  }
}

// --sort: the simulated plans in the order of that column (report/plan_tables.hpp), ties as ranked.
void sort_plans(api::Search& search, const api::SearchRequest& request, const std::string& column) {
  const nlohmann::json rows = api::search_rows(search, request);
  const std::vector<std::size_t> order = report::sorted_order(report::search_columns(rows, true), rows, column, "--sort");
  std::vector<api::SearchedPlan> sorted;
  for (const std::size_t i : order) sorted.push_back(search.plans[i]);
  search.plans = std::move(sorted);
}

void run_search(const SearchOptions& o) {
  const api::SearchRequest request = search_request(o);
  api::check_within_days(request.within_days, request.extras);
  require_outputs_before_work({{"--json", o.json_path}, {"--csv", o.csv_path}}, {scenario_input(o.scenario)});
  if (!o.sort.empty()) {  // an unknown column is refused before the work
    const std::vector<report::Column> columns = report::search_columns(nlohmann::json::array(), true);
    if (o.days <= 0 && report::column_named(columns, o.sort, "--sort").name == "finishes") {
      throw UserError("--sort finishes orders the plans by whether they finish within --days D: give --days");
    }
  }
  api::Search search = api::prepare_search(request);
  if (search.plans.empty()) {
    print_rejections(search.rejections);
    throw UserError(api::no_plan_message(search, request));
  }
  const int jobs = o.jobs > 0 ? o.jobs : default_jobs();
  const bool quiet = o.quiet || launched_rank().rank != 0;  // under mpirun / srun rank 0 speaks for all
  if (!quiet) print_start(search, o, jobs);
  const std::vector<std::string> extra = child_sim_arguments(o.train_tokens, o.usd_per_gpu_hour, o.goodput);
  bool follower = false;  // a rank other than 0 of an MPI job: rank 0 prints and writes for it
  // The simulations that run at once, over every rank. Every rank must hand out the same batches: --jobs is the same
  // on every rank, the cores of a host (the default) may not be, so without it each rank takes one plan per batch.
  const LaunchedRank launched = launched_rank();
  api::SearchRequest batched = request;
  batched.batch_plans = static_cast<std::size_t>(launched.size) *
                        static_cast<std::size_t>(launched.size > 1 && o.jobs <= 0 ? 1 : jobs);
  api::run_search(search, batched, ranks_simulator(jobs, "search", extra, !quiet, follower));
  if (follower) return;
  if (!o.sort.empty()) sort_plans(search, request, o.sort);
  print_plans(search, o);
  if (o.days > 0) print_within_days(api::search_rows(search, request), o.days, plan_text);
  print_rejections(search.rejections);
  if (!o.json_path.empty()) write_file_atomically(o.json_path, api::search_document(search, request).dump(1) + "\n");
  if (!o.csv_path.empty()) {
    const nlohmann::json rows = api::search_rows(search, request);
    write_file_atomically(o.csv_path, report::csv(report::search_columns(rows), rows));
  }
  end_job_if_a_rank_died();
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
                   "show the N fastest plans (default 48): plans are simulated in order of a lower bound on their "
                   "iteration time until the bound proves that no plan left out is faster than the N-th")
      ->check(at_least(1));
  command->add_flag("--all", o->all, "simulate and show every plan that fits (no pruning by the bound)");
  command->add_option("--memory-headroom", o->space.memory_headroom,
                      "memory a plan must leave free on each GPU to count as fitting: a share (\"5%\") or GiB "
                      "(\"4\"); default none, as the plans that really trained used up to 99.6 % of twin's estimate");
  command->add_flag("--explain", o->explain,
                    "list every plan not simulated with its reason (the rule it breaks, or the memory it needs)");
  command
      ->add_option("--jobs", o->jobs,
                   "simulations at a time on each host (default: one per core, shared among the MPI ranks on it)")
      ->check(between(1, 1024));
  command->add_flag("--vary-recompute", o->space.vary_recompute,
                    "also try recompute none, selective and full, and block recompute of a quarter, half and three "
                    "quarters of a chunk's layers (Megatron only)");
  command->add_flag("--vary-sequence-parallel", o->space.vary_sequence_parallel,
                    "also try each plan with tp > 1 with and without sequence parallelism");
  command->add_flag("--vary-zero", o->space.vary_zero,
                    "also try ZeRO stages 0 and 1 (Megatron-LM's distributed optimizer, DeepSpeed's ZeRO-1)");
  command->add_flag("--vary-schedule", o->space.vary_schedule,
                    "also try the zero-bubble schedules: ZB-H1 for each pipeline without chunks, ZB-V, DualPipeV and "
                    "DualPipe for each with two (where they apply)");
  command
      ->add_option("--vary-node", o->nodes,
                   "also search these node kinds (e.g. dgx-h100,dgx-h200,gb200-nvl72), each with the scenario's "
                   "number of GPUs in whole nodes")
      ->delimiter(',');
  command->add_flag("--vary-cp", o->space.vary_cp,
                    "also try context parallelism 1, 2, 4 and 8 (dp = GPUs / (tp x cp x pp)); without it, the "
                    "scenario's parallel.cp is kept");
  command->add_flag("--vary-etp", o->space.vary_etp,
                    "Mixture-of-Experts: also try expert tensor parallelism (etp 2, 4, ... up to a node) with each ep");
  command->add_option("--json", o->json_path, "write every plan and its result as JSON")->check(output_file());
  command->add_option("--csv", o->csv_path, "write the table as CSV, a line per plan simulated")->check(output_file());
  command->add_option("--sort", o->sort,
                      "order the table (and --json, --csv) by this column instead of fastest first: node, tp, pp, dp, "
                      "cp, ep, etp, mb, schedule, chunks, recompute, sharding, precision, iter_s, tflops, bubble, "
                      "mem_gib, fits, goodput, days, gpu_hours, cost_usd, error (ascending; tflops and goodput "
                      "largest first; plans that failed last)");
  command
      ->add_option("--usd-per-gpu-hour", o->usd_per_gpu_hour,
                   "with --train-tokens: each plan's GPU-hours priced at this many dollars per GPU-hour (JSON "
                   "training.cost_usd)")
      ->check(between(0.001, 1000));
  command
      ->add_option("--train-tokens", o->train_tokens,
                   "also estimate each plan's whole training run of this many tokens: days, GPU-hours")
      ->check(token_count("--train-tokens"));
  add_days_option(*command, o->days, "plan");
  command->add_flag("--goodput", o->goodput,
                    "rank by iteration time over goodput (the scenario's failure model, twin goodput): a goodput "
                    "column, and --train-tokens days with failures");
  command->add_flag("--quiet", o->quiet, "no progress on stderr (errors still)");
  command->callback([o] { run_search(*o); });
}

}  // namespace twin::cli

// A search's plans: the targets loaded, each one's plan space enumerated, each plan's lower bound computed, then
// branch and bound: simulated in the bound's order until the bound proves the best ones, and ranked.
#include "api/search.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <queue>
#include <stdexcept>

#include <fmt/core.h>

#include "api/measured_hardware.hpp"
#include "api/scenario.hpp"
#include "model/program/estimates.hpp"
#include "model/program/iteration_bound.hpp"
#include "model/scenario/errors.hpp"
#include "report/plan_documents.hpp"
#include "report/within_days.hpp"
#include "sim/cost_model.hpp"
#include "topology/hardware.hpp"

namespace twin::api {
namespace {

std::vector<model::Override> target_overrides(const SearchRequest& request,
                                              const std::vector<std::string>& extra_sets) {
  if (request.overrides_of) return request.overrides_of(extra_sets);
  std::vector<model::Override> overrides = parse_overrides(request.sets);
  for (const model::Override& one : parse_overrides(extra_sets)) overrides.push_back(one);
  return overrides;
}

void check_searchable(const model::Scenario& base, const SearchRequest& request) {
  if (base.cluster.node == model::NodeKind::CpuHost) {
    throw UserError("twin search simulates GPU clusters; this scenario runs on CPU hosts (cluster.node = cpu-host)");
  }
  try {  // the cluster's own GPU measurements: refused once here rather than in every plan's simulation
    sim::analytical_parameters(topology::node_spec(base.cluster.node).gpu, base.cluster);
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", base.source, error.what()));
  }
  if (request.space.vary_zero && base.framework.name == model::Framework::Composer) {
    throw UserError(
        "--vary-zero tries ZeRO stages 0 and 1 (Megatron-LM's distributed optimizer, DeepSpeed's ZeRO-1); "
        "framework.name = \"composer\" shards with FSDP (zero_stage = 3)");
  }
  // refused before any work
  model::headroom_bytes(request.space.memory_headroom, model::estimate_memory(base).capacity_bytes);
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

// The scenario's cluster, or with `nodes` the same number of GPUs in whole nodes of each kind (its GPUs per node from
// model/'s node table).
std::vector<SearchTarget> search_targets(const SearchRequest& request, const std::string& path) {
  const model::Scenario scenario = model::load_scenario(path, target_overrides(request, {}));
  if (request.nodes.empty()) return {{{}, scenario}};
  const std::int64_t gpus = scenario.cluster.total_gpus();
  std::vector<SearchTarget> targets;
  for (const std::string& name : request.nodes) {
    std::vector<std::string> sets{"cluster.node=" + name};
    const std::optional<model::NodeKind> node = node_kind(name);
    if (!node) {
      model::load_scenario(path, target_overrides(request, sets));  // the loader's error names the key and the kinds
      throw UserError(fmt::format("--vary-node: no node kind '{}'", name));
    }
    const std::int64_t per_node = model::default_gpus_per_node(node.value());
    if (gpus % per_node != 0) {
      throw UserError(fmt::format("--vary-node {}: the scenario's {} GPUs do not fill whole nodes of {} GPUs", name,
                                  gpus, per_node));
    }
    sets.push_back(fmt::format("cluster.gpus_per_node={}", per_node));
    sets.push_back(fmt::format("cluster.nodes={}", gpus / per_node));
    targets.push_back({sets, model::load_scenario(path, target_overrides(request, sets))});
  }
  return targets;
}

// What a search prices a plan's compute with, once per cluster: the cost model its simulation builds
// (api/simulation.cpp: the cluster's measured profile or its own measurements, else the cited ones) and the rate no
// weight GEMM beats (the FP8 one where the model runs FP8).
struct BoundPricing {
  std::unique_ptr<sim::AnalyticalCostModel> cost;
  double gemm_flops_per_s = 0;
};

BoundPricing bound_pricing(const model::Scenario& s) {
  const topology::GpuSpec gpu = topology::node_spec(s.cluster).gpu;
  const MeasuredHardware hardware = read_measured_hardware(s, "", false);
  BoundPricing pricing;
  try {
    pricing.cost = std::make_unique<sim::AnalyticalCostModel>(gpu, hardware.parameters(gpu, s.cluster));
    pricing.gemm_flops_per_s = pricing.cost->large_gemm_flops_per_s(s.model.dtype);
    if (s.model.fp8 != model::Fp8Format::None && gpu.fp8_flops > 0) {
      pricing.gemm_flops_per_s = std::max(pricing.gemm_flops_per_s,
                                          pricing.cost->large_gemm_flops_per_s(s.model.dtype, &s.framework.fp8_recipe));
    }
  } catch (const std::invalid_argument& error) {
    throw UserError(fmt::format("{}: {}", s.source, error.what()));
  }
  return pricing;
}

// The bound of plan scenario `s` (on the cluster `pricing` was made for), each layer's compute ops at the cost model's
// seconds.
double bound_s(const model::Scenario& s, const BoundPricing& pricing) {
  const sim::AnalyticalCostModel& cost = *pricing.cost;
  return model::iteration_time_lower_bound_s(s, pricing.gemm_flops_per_s,
                                             [&](const model::Op& op) { return cost.compute_time_s(s, op); });
}

// Where branch and bound stops after the first `handed` plans (by bound) are simulated: the first plan whose bound
// exceeds the `rows`-th best effective time of the plans before it, checked plan by plan as a one-at-a-time search
// would; none while that point lies past `handed` (more must be simulated), or the end when every plan is.
std::optional<std::size_t> bound_stop(const std::vector<SearchedPlan>& plans, std::size_t handed, std::size_t rows) {
  std::priority_queue<double> best;  // the `rows` smallest effective times so far, the largest on top
  for (std::size_t i = 0; i <= handed && i < plans.size(); ++i) {
    if (rows > 0 && best.size() == rows && plans[i].plan.iteration_time_bound_s > best.top()) return i;
    if (i == handed) return std::nullopt;
    if (!plans[i].outcome.error.empty()) continue;
    best.push(plans[i].effective_time_s());
    if (best.size() > rows) best.pop();
  }
  return plans.size();
}

// Simulates plans [begin, end) and records their outcomes; false when the simulator returned fewer than asked.
bool simulate_plans(Search& search, const SearchRequest& request, const VariantSimulator& simulator,
                    std::size_t begin, std::size_t end) {
  std::vector<std::vector<std::string>> override_lists;
  for (std::size_t i = begin; i < end; ++i) {
    const SearchedPlan& one = search.plans[i];
    std::vector<std::string> sets;
    for (const model::Override& o : target_overrides(request, search.targets[one.target].extra_sets)) {
      sets.push_back(o.key + "=" + o.value);
    }
    for (const std::string& set : one.plan.overrides()) sets.push_back(set);
    override_lists.push_back(std::move(sets));
  }
  const std::vector<VariantOutcome> outcomes = simulator(search.scenario_path, override_lists, request.extras);
  for (std::size_t i = begin; i < end; ++i) {
    SearchedPlan& one = search.plans[i];
    if (i - begin >= outcomes.size()) {
      one.outcome = {{}, "not simulated: the search ended before it", 1};
      continue;
    }
    one.outcome = outcomes[i - begin];
    if (!one.outcome.error.empty()) continue;
    one.iteration_time_s = one.outcome.summary.at("iteration_time_s").get<double>();
    if (request.extras.goodput) {
      one.goodput_fraction = one.outcome.summary.at("goodput").at("goodput_fraction").get<double>();
    }
  }
  return outcomes.size() >= end - begin;
}

// --explain: the plans the bound left out, each with its bound and the time it had to beat.
void explain_bound(Search& search, std::size_t rows) {
  if (search.pruned_by_bound == 0) return;
  std::vector<double> times;
  for (std::size_t i = 0; i < search.simulated; ++i) {
    if (search.plans[i].outcome.error.empty()) times.push_back(search.plans[i].effective_time_s());
  }
  std::sort(times.begin(), times.end());
  const double to_beat = times.at(rows - 1);
  for (std::size_t i = search.simulated; i < search.plans.size(); ++i) {
    search.rejections.push_back(
        {search.plans[i].plan.label(),
         fmt::format("at least {:.3f} s per iteration (its lower bound), slower than the {} best simulated (up to "
                     "{:.3f} s)",
                     search.plans[i].plan.iteration_time_bound_s, rows, to_beat),
         false});
  }
}

}  // namespace

Search prepare_search(const SearchRequest& request) {
  Search search;
  search.scenario_path = resolve_scenario_path(request.scenario);
  search.targets = search_targets(request, search.scenario_path);
  for (std::size_t t = 0; t < search.targets.size(); ++t) {
    const model::Scenario& base = search.targets[t].base;
    check_searchable(base, request);
    const model::PlanEnumeration found = model::enumerate_plans(base, request.space, request.explain);
    const BoundPricing pricing = bound_pricing(base);
    for (model::Plan plan : found.plans) {
      plan.iteration_time_bound_s = bound_s(model::with_plan(base, plan), pricing);
      search.plans.push_back({plan, t});
    }
    search.rejected_for_memory += found.rejected_for_memory;
    search.invalid += found.invalid;
    search.rejections.insert(search.rejections.end(), found.rejections.begin(), found.rejections.end());
  }
  // By bound, the order of simulation; ties by ideal bubble, then the target's order.
  std::stable_sort(search.plans.begin(), search.plans.end(), [](const SearchedPlan& a, const SearchedPlan& b) {
    if (a.plan.iteration_time_bound_s != b.plan.iteration_time_bound_s) {
      return a.plan.iteration_time_bound_s < b.plan.iteration_time_bound_s;
    }
    return a.plan.ideal_bubble < b.plan.ideal_bubble;
  });
  search.found = search.plans.size();
  search.enumerated = search.found + static_cast<std::size_t>(search.rejected_for_memory + search.invalid);
  return search;
}

double iteration_time_bound_s(const model::Scenario& scenario) { return bound_s(scenario, bound_pricing(scenario)); }

std::string no_plan_message(const Search& search, const SearchRequest& request) {
  const model::Scenario& base = search.targets.front().base;
  return fmt::format("no valid plan of {} fits {} x {} GPUs ({} rejected for memory with --memory-headroom {}{})",
                     base.model.name, base.cluster.nodes, base.cluster.gpus_per_node, search.rejected_for_memory,
                     request.space.memory_headroom,
                     request.explain ? "" : "; --explain lists every plan with its reason");
}

void run_search(Search& search, const SearchRequest& request, const VariantSimulator& simulator) {
  const std::size_t rows = request.all ? search.plans.size()
                                       : std::min(search.plans.size(), static_cast<std::size_t>(request.max_plans));
  std::size_t handed = 0;  // plans given to the simulator, a prefix of the bound's order
  std::optional<std::size_t> stop;
  while (!(stop = bound_stop(search.plans, handed, rows))) {
    // The first `rows` successes are needed whatever they are: at least as many more plans as are missing.
    std::size_t successes = 0;
    for (std::size_t i = 0; i < handed; ++i) successes += search.plans[i].outcome.error.empty() ? 1 : 0;
    const std::size_t wanted =
        std::max(rows - std::min(rows, successes), std::max<std::size_t>(1, request.batch_plans));
    const std::size_t end = std::min(search.plans.size(), handed + wanted);
    if (!simulate_plans(search, request, simulator, handed, end)) {
      stop = handed;  // the simulator gave up (an MPI rank that failed): the plans it did not report count as failed
      break;
    }
    handed = end;
  }
  search.simulated = *stop;
  search.pruned_by_bound = search.plans.size() - *stop;
  if (request.explain) explain_bound(search, rows);
  search.plans.resize(*stop);  // a batch's plans past the stop are dropped: the result does not depend on the batch
  std::stable_sort(search.plans.begin(), search.plans.end(), [](const SearchedPlan& a, const SearchedPlan& b) {
    if (a.outcome.error.empty() != b.outcome.error.empty()) return a.outcome.error.empty();
    return a.effective_time_s() < b.effective_time_s();
  });
  // The rows asked for, then the failures (whose plans are left unranked).
  std::size_t successes = 0;
  std::vector<SearchedPlan> shown;
  for (SearchedPlan& one : search.plans) {
    if (!one.outcome.error.empty() || successes++ < rows) shown.push_back(std::move(one));
  }
  search.plans = std::move(shown);
}

Search search(const SearchRequest& request, const VariantSimulator& simulator) {
  Search result = prepare_search(request);
  if (result.plans.empty()) throw UserError(no_plan_message(result, request));
  run_search(result, request, simulator);
  return result;
}

nlohmann::json search_rows(const Search& search, const SearchRequest& request) {
  nlohmann::json rows = nlohmann::json::array();
  for (const SearchedPlan& one : search.plans) {
    const model::ClusterSpec& cluster = search.targets[one.target].base.cluster;
    const report::SearchRow row{one.plan, std::string(model::to_string(cluster.node)), cluster.nodes, one.outcome.error,
                                one.outcome.summary};
    rows.push_back(report::search_row_json(row, !request.extras.train_tokens.empty(), request.extras.goodput));
  }
  if (request.within_days > 0) report::mark_finishes_in_days(rows, request.within_days);
  return rows;
}

report::SearchCounts search_counts(const Search& search) {
  return {search.enumerated, static_cast<std::size_t>(search.invalid),
          static_cast<std::size_t>(search.rejected_for_memory), search.found, search.pruned_by_bound,
          search.simulated};
}

nlohmann::json search_document(const Search& search, const SearchRequest& request) {
  const nlohmann::json rows = search_rows(search, request);
  nlohmann::json document =
      report::search_document(search.targets.front().base.model.name, rows, search_counts(search),
                              request.space.memory_headroom, request.explain, search.rejections);
  if (request.within_days > 0) {
    const std::optional<std::size_t> best = report::fewest_gpus_within_days(rows);
    document["fewest_gpus_within_days"] = best ? rows[*best] : nlohmann::json(nullptr);
  }
  return document;
}

}  // namespace twin::api

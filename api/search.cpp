// A search's plans: the targets loaded, each one's plan space enumerated, the plans interleaved across targets and
// cut by ideal bubble, simulated, and ranked.
#include "api/search.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include <fmt/core.h>

#include "api/scenario.hpp"
#include "model/program/estimates.hpp"
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

}  // namespace

Search prepare_search(const SearchRequest& request) {
  Search search;
  search.scenario_path = resolve_scenario_path(request.scenario);
  search.targets = search_targets(request, search.scenario_path);
  std::vector<std::vector<SearchedPlan>> per_target;
  for (std::size_t t = 0; t < search.targets.size(); ++t) {
    check_searchable(search.targets[t].base, request);
    model::PlanEnumeration found = model::enumerate_plans(search.targets[t].base, request.space, request.explain);
    per_target.emplace_back();
    for (const model::Plan& plan : found.plans) per_target.back().push_back({plan, t});
    search.rejected_for_memory += found.rejected_for_memory;
    search.rejections.insert(search.rejections.end(), found.rejections.begin(), found.rejections.end());
  }
  // Each target's plans in turn, then by ideal bubble: a --max cut keeps every node kind's best plans.
  for (std::size_t i = 0, added = 1; added > 0; ++i) {
    added = 0;
    for (const std::vector<SearchedPlan>& list : per_target) {
      if (i >= list.size()) continue;
      search.plans.push_back(list[i]);
      ++added;
    }
  }
  std::stable_sort(search.plans.begin(), search.plans.end(), [](const SearchedPlan& a, const SearchedPlan& b) {
    return a.plan.ideal_bubble < b.plan.ideal_bubble;
  });
  search.found = search.plans.size();
  if (!request.all && search.plans.size() > static_cast<std::size_t>(request.max_plans)) {
    search.plans.resize(request.max_plans);
  }
  return search;
}

std::string no_plan_message(const Search& search, const SearchRequest& request) {
  const model::Scenario& base = search.targets.front().base;
  return fmt::format("no valid plan of {} fits {} x {} GPUs ({} rejected for memory with --memory-headroom {}{})",
                     base.model.name, base.cluster.nodes, base.cluster.gpus_per_node, search.rejected_for_memory,
                     request.space.memory_headroom,
                     request.explain ? "" : "; --explain lists every plan with its reason");
}

void run_search(Search& search, const SearchRequest& request, const VariantSimulator& simulator) {
  std::vector<std::vector<std::string>> override_lists;
  for (const SearchedPlan& one : search.plans) {
    std::vector<std::string> sets;
    for (const model::Override& o : target_overrides(request, search.targets[one.target].extra_sets)) {
      sets.push_back(o.key + "=" + o.value);
    }
    for (const std::string& set : one.plan.overrides()) sets.push_back(set);
    override_lists.push_back(std::move(sets));
  }
  const std::vector<VariantOutcome> outcomes = simulator(search.scenario_path, override_lists, request.extras);
  for (std::size_t i = 0; i < search.plans.size() && i < outcomes.size(); ++i) {
    SearchedPlan& one = search.plans[i];
    one.outcome = outcomes[i];
    if (!one.outcome.error.empty()) continue;
    one.iteration_time_s = one.outcome.summary.at("iteration_time_s").get<double>();
    if (request.extras.goodput) {
      one.goodput_fraction = one.outcome.summary.at("goodput").at("goodput_fraction").get<double>();
    }
  }
  std::stable_sort(search.plans.begin(), search.plans.end(), [](const SearchedPlan& a, const SearchedPlan& b) {
    if (a.outcome.error.empty() != b.outcome.error.empty()) return a.outcome.error.empty();
    return a.effective_time_s() < b.effective_time_s();
  });
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

nlohmann::json search_document(const Search& search, const SearchRequest& request) {
  const nlohmann::json rows = search_rows(search, request);
  nlohmann::json document =
      report::search_document(search.targets.front().base.model.name, rows, search.found, search.rejected_for_memory,
                              request.space.memory_headroom, request.explain, search.rejections);
  if (request.within_days > 0) {
    const std::optional<std::size_t> best = report::fewest_gpus_within_days(rows);
    document["fewest_gpus_within_days"] = best ? rows[*best] : nlohmann::json(nullptr);
  }
  return document;
}

}  // namespace twin::api

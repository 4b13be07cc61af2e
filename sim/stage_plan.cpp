// Engine::build_plan: one stage's StagePlan, read from the Program: each op's predecessors (its deps, the previous op
// of its ordered stream, and the blocking rules of the framework's pipeline exchanges), its duration when it is
// timed without the network, and when the host issues it.
#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "model/ops/context_parallel_ring.hpp"
#include "model/ops/host_issue.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/ops/tp_overlap.hpp"
#include "sim/all_to_all.hpp"
#include "sim/engine.hpp"

namespace twin::sim::detail {

namespace {

bool ordered(model::Stream stream) {
  return stream != model::Stream::Pipeline;
}

StagePlan empty_plan(int stage, const std::vector<model::Op>& ops) {
  const auto n = ops.size();
  StagePlan plan;
  plan.stage = stage;
  plan.ops = &ops;
  plan.duration.assign(n, 0.0);
  plan.local.assign(n, 0);
  plan.rendezvous.assign(n, 0);
  plan.lead.assign(n, 0.0);
  plan.receipt_s.assign(n, 0.0);
  plan.pending.assign(n, 0);
  plan.collective_seq.assign(n, -1);
  plan.recv_slot.assign(n, -1);
  return plan;
}

// Predecessors (CSR in `begin` / `predecessors`): deps plus the previous op of the same ordered stream plus `extra`;
// each op's count in plan.pending.
void link_predecessors(StagePlan& plan, const std::vector<std::vector<std::int32_t>>& extra,
                       std::vector<std::int32_t>& begin, std::vector<std::int32_t>& predecessors) {
  const std::vector<model::Op>& ops = *plan.ops;
  const auto n = static_cast<std::int32_t>(ops.size());
  begin.assign(n + 1, 0);
  predecessors.clear();
  std::int32_t last_on_stream[model::kStreamCount];
  std::fill(std::begin(last_on_stream), std::end(last_on_stream), -1);
  for (std::int32_t i = 0; i < n; ++i) {
    const model::Op& op = ops[i];
    const std::size_t first = predecessors.size();
    for (std::int32_t dep : op.deps) {
      if (dep < 0 || dep >= i) {
        throw SimulationError(fmt::format("stage {} op {}: dependency {} is not an earlier op", plan.stage, i, dep));
      }
      predecessors.push_back(dep);
    }
    for (std::int32_t before : extra[i]) predecessors.push_back(before);
    const auto stream = static_cast<int>(op.stream);
    if (ordered(op.stream) && last_on_stream[stream] >= 0) predecessors.push_back(last_on_stream[stream]);
    std::sort(predecessors.begin() + static_cast<std::ptrdiff_t>(first), predecessors.end());
    predecessors.erase(std::unique(predecessors.begin() + static_cast<std::ptrdiff_t>(first), predecessors.end()),
                       predecessors.end());
    begin[i + 1] = static_cast<std::int32_t>(predecessors.size());
    if (ordered(op.stream)) last_on_stream[stream] = i;
    plan.pending[i] = begin[i + 1] - begin[i];
  }
}

void link_successors(StagePlan& plan, const std::vector<std::int32_t>& begin,
                     const std::vector<std::int32_t>& predecessors) {
  const auto n = static_cast<std::int32_t>(plan.ops->size());
  plan.successor_begin.assign(n + 1, 0);
  for (std::int32_t p : predecessors) ++plan.successor_begin[p + 1];
  for (std::int32_t i = 0; i < n; ++i) plan.successor_begin[i + 1] += plan.successor_begin[i];
  plan.successors.assign(predecessors.size(), 0);
  std::vector<std::int32_t> fill(plan.successor_begin.begin(), plan.successor_begin.end() - 1);
  for (std::int32_t i = 0; i < n; ++i) {
    for (std::int32_t k = begin[i]; k < begin[i + 1]; ++k) plan.successors[fill[predecessors[k]]++] = i;
  }
}

}  // namespace

StagePlan Engine::build_plan(int stage) const {
  StagePlan plan = empty_plan(stage, program_.stage_ops[stage]);
  std::vector<std::int32_t> predecessor_begin, predecessors;
  link_predecessors(plan, exchange_dependencies(plan), predecessor_begin, predecessors);
  time_ops(plan);
  pace_host(plan);
  link_successors(plan, predecessor_begin, predecessors);
  return plan;
}

// Blocking pipeline exchanges (model/ops/exchanges.hpp), as the Program says the framework issues them: the compute op
// after an exchange waits for every op of it; batched or serialized exchanges also rendezvous: their ops are posted
// when the compute op before them ends (serialized: one after the other, in the framework's order) and a transfer
// starts once both sides have posted. Eager ones leave as soon as their dependencies allow.
std::vector<std::vector<std::int32_t>> Engine::exchange_dependencies(StagePlan& plan) const {
  std::vector<std::vector<std::int32_t>> extra(plan.ops->size());
  if (!options_.blocking_p2p) return extra;
  const bool rendezvous = program_.exchange_issue != model::ExchangeIssue::Eager;
  const bool serialized = program_.exchange_issue == model::ExchangeIssue::Serialized;
  for (const model::PipelineExchange& exchange : program_.stage_exchanges[plan.stage]) {
    for (std::size_t k = 0; k < exchange.ops.size(); ++k) {
      const std::int32_t op = exchange.ops[k];
      plan.rendezvous[op] = rendezvous ? 1 : 0;
      if (rendezvous && exchange.after >= 0) extra[op].push_back(exchange.after);
      if (serialized && k > 0) extra[op].push_back(exchange.ops[k - 1]);
      if (exchange.before >= 0) extra[exchange.before].push_back(op);
    }
  }
  return extra;
}

// How each group's collectives are timed on a stage (the same for every op of the stage): nothing to do (a group of
// one), NCCL's time without flows (every member in one TP group: inside one node, on NVLinks nothing else uses), or
// flows on the platform.
// Seconds of an op's routed-expert GEMMs: the op's own, or a fused layer's expert parts.
double Engine::expert_seconds(const model::Scenario& scenario, const model::Op& op) const {
  const auto is_expert = [](model::ComputeKind what) {
    return what == model::ComputeKind::ExpertUp || what == model::ComputeKind::ExpertDown;
  };
  if (is_expert(op.what)) return cost_.compute_time_s(scenario, op);
  double seconds = 0;
  if (op.breakdown) {
    for (const model::Op& part : op.breakdown->parts) {
      if (is_expert(part.what)) seconds += cost_.compute_time_s(scenario, part);
    }
  }
  return seconds;
}

double Engine::expert_load_scale(int id) const {
  const model::Scenario& scenario = program_.scenario;
  if (!scenario.model.is_moe() || fidelity_ != Fidelity::Rank) return 1;
  const std::vector<double> shares = model::ep_rank_row_shares(scenario);
  const double hottest = *std::max_element(shares.begin(), shares.end());
  return hottest > 0 ? shares[static_cast<std::size_t>(program_.layout.expert_coord_of(id).ep)] / hottest : 1;
}

Engine::GroupTiming Engine::group_timing(int stage) const {
  GroupTiming timing;
  const int rank0 = program_.layout.rank_of({0, stage, 0});
  for (int group = 0; group < model::kGroupCount; ++group) {
    const std::vector<int> ranks = program_.layout.group_members(static_cast<model::Group>(group), rank0);
    for (int rank : ranks) timing.nodes[group].push_back(placement_.node_of_rank(rank));
    if (ranks.size() <= 1) {
      timing.kind[group] = GroupTiming::Single;
    } else if (fidelity_ == Fidelity::Group &&
               group_members(static_cast<model::Group>(group), rank0 / program_.layout.tp()).size() <= 1) {
      timing.kind[group] = GroupTiming::InsideTensorGroup;
    } else {
      timing.kind[group] = GroupTiming::Flows;
    }
  }
  return timing;
}

void Engine::time_ops(StagePlan& plan) const {
  const model::Scenario& scenario = program_.scenario;
  const std::vector<model::Op>& ops = *plan.ops;
  const GroupTiming groups = group_timing(plan.stage);
  std::map<std::tuple<int, int, double>, double> estimates;  // (group, kind, bytes) -> NCCL's time without flows
  // framework.tp_comm_overlap: how long a backward TP collective can hide under the GEMM half beside it.
  std::map<std::pair<int, int>, double> hidden;
  const auto lead_of = [&](const model::Op& op) {
    const model::HiddenUnder under = model::tp_overlap(scenario, op);
    if (under == model::HiddenUnder::Nothing) return 0.0;
    const auto key = std::make_pair(static_cast<int>(op.what), static_cast<int>(under));
    auto [it, created] = hidden.try_emplace(key, 0.0);
    if (created) it->second = cost_.gemm_half_s(scenario, op.what, under == model::HiddenUnder::WeightGradient);
    return it->second;
  };
  if (scenario.model.is_moe()) plan.expert_s.assign(ops.size(), 0.0);
  int collectives_seen[model::kGroupCount] = {};
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(ops.size()); ++i) {
    const model::Op& op = ops[i];
    switch (op.kind) {
      case model::OpKind::Compute:
        plan.local[i] = 1;
        plan.duration[i] = cost_.compute_time_s(scenario, op);
        if (scenario.model.is_moe()) plan.expert_s[i] = expert_seconds(scenario, op);
        break;
      case model::OpKind::Collective: {
        const auto group = static_cast<int>(op.group);
        plan.collective_seq[i] = collectives_seen[group]++;
        plan.lead[i] = lead_of(op);
        if (groups.kind[group] == GroupTiming::Single) {
          plan.local[i] = 1;  // a group of one: nothing to do
        } else if (groups.kind[group] == GroupTiming::InsideTensorGroup) {
          plan.local[i] = 1;
          const auto key = std::make_tuple(group, static_cast<int>(op.collective), op.bytes);
          auto [it, created] = estimates.try_emplace(key, 0.0);
          if (created) {
            it->second = plan_op_collective(op, groups.nodes[group], communication_, options_.algorithm).estimate_s;
          }
          // Only what the GEMM does not hide, and the SMs the collective took from it.
          plan.duration[i] = exposed_beside_gemm_s(it->second, plan.lead[i], collective_sm_share());
        }
        break;
      }
      case model::OpKind::Recv:
      case model::OpKind::Send:
        // A CP ring's message: Transformer Engine posts both ends at the start of a step (batch_isend_irecv), so it
        // moves once both are posted, as a two-member instance on its own stream.
        if (model::is_cp_ring_message(op)) {
          plan.rendezvous[i] = 1;
        } else if (op.kind == model::OpKind::Recv) {
          plan_recv(plan, i);
        }
        break;
    }
  }
}

void Engine::plan_recv(StagePlan& plan, std::int32_t i) const {
  const model::Op& op = (*plan.ops)[i];
  const int from = op.peer_stage;
  if (!plan.recv_by_tag.emplace(p2p_key(from, model::p2p_tag(op)), i).second) {
    throw SimulationError(fmt::format("stage {}: two Recv ops share the tag of op {}", plan.stage, i));
  }
  if (plan.rendezvous[i]) return;  // matched as a two-member instance, not through an inbox
  plan.pending[i] += 1;            // the eager message itself
  if (!communication_.ideal) plan.receipt_s[i] = receipt_s(model::pipeline_transfer(program_.scenario, op));
  plan.recv_slot[i] = plan.recv_count++;
  if (std::find(plan.peer_stages.begin(), plan.peer_stages.end(), from) == plan.peer_stages.end()) {
    plan.peer_stages.push_back(from);
  }
}

// The host issues the ops in list order (model/program/program.hpp), without waiting for the GPU. A compute op waits for its
// kernels' launches; a collective or a message is one call, whose time delays the ops after it (the GPU reaches it
// only after the compute op before it, which the host issued first).
void Engine::pace_host(StagePlan& plan) const {
  const std::vector<model::Op>& ops = *plan.ops;
  const auto n = ops.size();
  plan.issue_first_s.assign(n, 0.0);
  plan.issue_last_s.assign(n, 0.0);
  plan.last_kernel_s.assign(n, 0.0);
  double issued_s = 0;
  std::optional<model::CudaGraphKey> last_graph;  // the CUDA graph launched last (model/ops/host_issue.hpp)
  for (std::size_t i = 0; i < n; ++i) {
    HostCost host = cost_.host_cost(program_.scenario, ops[i]);
    if (host.graph_launch_s > 0) {
      // The first op of a graph pays its launch; the graph issues the rest of it with it.
      const model::CudaGraphKey key = model::cuda_graph_key(ops[i]);
      if (last_graph != key) {
        host.seconds += host.graph_launch_s;
        host.kernels += 1;
        last_graph = key;
      }
    }
    plan.issue_first_s[i] = plan.issue_last_s[i] = issued_s;
    if (host.seconds <= 0 && host.graph_launch_s <= 0) continue;
    plan.host_paced = true;
    if (host.seconds <= 0) continue;  // issued by a graph the host launched before it
    if (ops[i].kind == model::OpKind::Compute) {
      const int kernels = std::max(1, host.kernels);
      plan.issue_first_s[i] = issued_s + host.seconds / kernels;
      plan.issue_last_s[i] = issued_s + host.seconds;
      plan.last_kernel_s[i] = plan.duration[i] / kernels;
    }
    issued_s += host.seconds;
  }
  if (!plan.host_paced) {  // a host that is never behind: nothing to look up while replaying
    plan.issue_first_s = {};
    plan.issue_last_s = {};
    plan.last_kernel_s = {};
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (model::host_waits_for(program_.scenario, ops[i])) plan.host_syncs.push_back(static_cast<std::int32_t>(i));
  }
}

}  // namespace twin::sim::detail

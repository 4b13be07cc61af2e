#include "sim/all_to_all.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "sim/measured_tables.hpp"

namespace twin::sim {

namespace {

// Flows from the members `from` to the members `to` (member indices) that carry, in all, what each of `from` sends to
// `to` (rows) and what each of `to` receives from `from` (columns): the north-west corner rule of the transportation
// problem, at most |from| + |to| - 1 flows.
void add_node_pair_flows(const std::vector<std::vector<double>>& bytes, const std::vector<int>& from,
                         const std::vector<int>& to, double bandwidth_scale, std::vector<Flow>& flows) {
  std::vector<double> sends(from.size(), 0.0), receives(to.size(), 0.0);
  for (std::size_t a = 0; a < from.size(); ++a) {
    for (std::size_t b = 0; b < to.size(); ++b) {
      sends[a] += bytes[from[a]][to[b]];
      receives[b] += bytes[from[a]][to[b]];
    }
  }
  std::size_t a = 0, b = 0;
  while (a < from.size() && b < to.size()) {
    const double moved = std::min(sends[a], receives[b]);
    if (moved > 0) flows.push_back({from[a], to[b], moved * bandwidth_scale});
    if (sends[a] <= receives[b]) {
      receives[b] -= sends[a];
      ++a;
    } else {
      sends[a] -= receives[b];
      ++b;
    }
  }
}

// Per node pair: the flows between two different nodes' members.
std::vector<Flow> node_pair_flows(const std::vector<std::vector<double>>& bytes, const std::vector<int>& member_nodes,
                                  double bandwidth_scale) {
  std::map<int, std::vector<int>> members_of_node;
  for (int i = 0; i < static_cast<int>(member_nodes.size()); ++i) members_of_node[member_nodes[i]].push_back(i);
  std::vector<Flow> flows;
  for (const auto& [from_node, from] : members_of_node) {
    for (const auto& [to_node, to] : members_of_node) {
      if (from_node != to_node) add_node_pair_flows(bytes, from, to, bandwidth_scale, flows);
    }
  }
  return flows;
}

// The time OpenXLA measured for an all-to-all of the group's size inside one node of this GPU's
// (sim/data/collectives_by_size.csv), at the busiest member's operand: what it sends plus its own share (XLA's
// benchmark counts the whole operand, xla/tools/collective_perf_table_gen.cc GetNetworkThroughputBytesPerSec), the
// own share taken as the mean of what it sends each peer. 0 where no table was measured (the A100, other group sizes).
// The measurement's small sizes carry NCCL's real latency floor (8 GPUs of an H100 node: 16 us at 8 KiB, 71 us at
// 8 MiB, against the tuning model's 12 us and 32 us); its large ones a rate below NCCL's bus-bandwidth model.
double measured_floor_s(const std::vector<std::vector<double>>& bytes, const CommunicationModel& model) {
  const int n = static_cast<int>(bytes.size());
  const CollectiveTable* table = all_to_all_table(model.node.gpu.name, n);
  if (!table) return 0;
  double busiest = 0;
  for (const auto& row : bytes) {
    double sent = 0;
    for (double b : row) sent += b;
    busiest = std::max(busiest, sent * n / (n - 1));
  }
  return table->seconds(busiest);
}

}  // namespace

CollectivePlan plan_all_to_all(const std::vector<std::vector<double>>& bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, double bandwidth_scale, AllToAllFlows flows) {
  const int n = static_cast<int>(member_nodes.size());
  if (static_cast<int>(bytes.size()) != n) throw std::invalid_argument("plan_all_to_all: one row of bytes per member");
  CollectivePlan plan;
  plan.algorithm = CollectiveAlgorithm::Analytical;
  if (n <= 1 || model.ideal) return plan;  // nothing leaves the rank, or a free network
  plan.protocol = Protocol::Simple;
  FlowPhase phase;
  bool crosses_nodes = false;
  double slowest_s = 0;
  double nvlink_s = 0;  // the busiest NVLink port's bytes at its rate
  const double nvlink = model.node.nvlink_effective_bytes_per_s, nic = model.node.nic_effective_bytes_per_s;
  for (int i = 0; i < n; ++i) {
    if (static_cast<int>(bytes[i].size()) != n) {
      throw std::invalid_argument("plan_all_to_all: one column of bytes per member");
    }
    // Each direction of a member's NVLink port and NIC carries its own bytes (split-duplex links).
    double nvlink_out = 0, nic_out = 0, nvlink_in = 0, nic_in = 0;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      const bool across = member_nodes[i] != member_nodes[j];
      crosses_nodes |= across && (bytes[i][j] > 0 || bytes[j][i] > 0);
      (across ? nic_out : nvlink_out) += bytes[i][j];
      (across ? nic_in : nvlink_in) += bytes[j][i];
      if (bytes[i][j] > 0 && flows == AllToAllFlows::PerPair) {
        phase.flows.push_back({i, j, bytes[i][j] * bandwidth_scale});
      }
    }
    slowest_s = std::max({slowest_s, nvlink_out / nvlink, nvlink_in / nvlink, nic_out / nic, nic_in / nic});
    nvlink_s = std::max({nvlink_s, nvlink_out / nvlink, nvlink_in / nvlink});
  }
  const NcclTuning& nccl = model.nccl;
  phase.latency_s =
      nccl.ring_simple_base_s + (crosses_nodes ? nccl.ring_simple_net_step_s : nccl.ring_simple_nvlink_step_s);
  plan.estimate_s = phase.latency_s + slowest_s;
  // Inside one node, no faster than the all-to-all measured there at the busiest member's size (measured_floor_s):
  // the flows' phase lasts at least that long less its latency.
  if (!crosses_nodes) {
    const double floor_s = measured_floor_s(bytes, model);
    phase.min_s = std::max(phase.min_s, floor_s - phase.latency_s);
    plan.estimate_s = std::max(plan.estimate_s, floor_s);
  }
  if (flows == AllToAllFlows::PerNodePair) {
    if (!crosses_nodes) {
      plan.algorithm = CollectiveAlgorithm::Analytical;  // NVLink ports alone: the estimate, no flows
      return plan;
    }
    phase.flows = node_pair_flows(bytes, member_nodes, bandwidth_scale);
    phase.min_s = nvlink_s;
  }
  plan.algorithm = CollectiveAlgorithm::Ring;  // flows on the platform (the engine replays phases)
  plan.phases.push_back(std::move(phase));
  return plan;
}

namespace {

// What each of `n` members sends each other: Op::peer_bytes, or Op::bytes spread evenly when it has none of that size.
std::vector<std::vector<double>> peer_bytes_of(const model::Op& op, std::size_t n) {
  std::vector<std::vector<double>> bytes(n, std::vector<double>(n, n > 0 ? op.bytes / static_cast<double>(n) : 0));
  if (op.peer_bytes && op.peer_bytes->size() == n * n) {
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) bytes[i][j] = (*op.peer_bytes)[i * n + j];
    }
  }
  for (std::size_t i = 0; i < n; ++i) bytes[i][i] = 0;
  return bytes;
}

}  // namespace

CollectivePlan plan_op_collective(const model::Op& op, const std::vector<int>& member_nodes,
                                  const CommunicationModel& model, CollectiveAlgorithm requested,
                                  double bandwidth_scale, AllToAllFlows flows) {
  if (op.collective != model::CollectiveKind::AllToAll) {
    return plan_collective(op.collective, op.bytes, member_nodes, model, requested, bandwidth_scale);
  }
  return plan_all_to_all(peer_bytes_of(op, member_nodes.size()), member_nodes, model, bandwidth_scale, flows);
}

CollectivePlan plan_all_to_all_of_actors(const model::Op& op, const std::vector<int>& rank_nodes,
                                         const std::vector<int>& actor_of_rank, const std::vector<int>& actor_nodes,
                                         const CommunicationModel& model) {
  const std::vector<std::vector<double>> bytes = peer_bytes_of(op, rank_nodes.size());
  CollectivePlan plan = plan_all_to_all(bytes, rank_nodes, model, 1, AllToAllFlows::PerNodePair);
  if (plan.phases.empty()) return plan;  // inside one node: the ranks' estimate
  const std::size_t actors = actor_nodes.size();
  std::vector<std::vector<double>> summed(actors, std::vector<double>(actors, 0.0));
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (std::size_t j = 0; j < bytes.size(); ++j) summed[actor_of_rank[i]][actor_of_rank[j]] += bytes[i][j];
  }
  plan.phases[0].flows = node_pair_flows(summed, actor_nodes, 1);
  // A bundled link evens out its ranks' bytes; the busiest rank's own NIC (the hottest EP rank's) still bounds it.
  plan.phases[0].min_s = plan.estimate_s - plan.phases[0].latency_s;
  return plan;
}

}  // namespace twin::sim

#include "sim/all_to_all.hpp"

#include <algorithm>
#include <stdexcept>

namespace twin::sim {

CollectivePlan plan_all_to_all(const std::vector<std::vector<double>>& bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, double bandwidth_scale) {
  const int n = static_cast<int>(member_nodes.size());
  if (static_cast<int>(bytes.size()) != n) throw std::invalid_argument("plan_all_to_all: one row of bytes per member");
  CollectivePlan plan;
  plan.algorithm = CollectiveAlgorithm::Analytical;
  if (n <= 1 || model.ideal) return plan;  // nothing leaves the rank, or a free network
  plan.protocol = Protocol::Simple;
  FlowPhase phase;
  bool crosses_nodes = false;
  double slowest_s = 0;
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
      if (bytes[i][j] > 0) phase.flows.push_back({i, j, bytes[i][j] * bandwidth_scale});
    }
    slowest_s = std::max({slowest_s, nvlink_out / nvlink, nvlink_in / nvlink, nic_out / nic, nic_in / nic});
  }
  const NcclTuning& nccl = model.nccl;
  phase.latency_s =
      nccl.ring_simple_base_s + (crosses_nodes ? nccl.ring_simple_net_step_s : nccl.ring_simple_nvlink_step_s);
  plan.estimate_s = phase.latency_s + slowest_s;
  plan.algorithm = CollectiveAlgorithm::Ring;  // flows on the platform (the engine replays phases)
  plan.phases.push_back(std::move(phase));
  return plan;
}

bool inside_one_node(const std::vector<int>& member_nodes) {
  return std::all_of(member_nodes.begin(), member_nodes.end(),
                     [&](int node) { return node == member_nodes.front(); });
}

CollectivePlan plan_op_collective(const model::Op& op, const std::vector<int>& member_nodes,
                                  const CommunicationModel& model, CollectiveAlgorithm requested,
                                  double bandwidth_scale) {
  if (op.collective != model::CollectiveKind::AllToAll) {
    return plan_collective(op.collective, op.bytes, member_nodes, model, requested, bandwidth_scale);
  }
  const std::size_t n = member_nodes.size();
  std::vector<std::vector<double>> bytes(n, std::vector<double>(n, n > 0 ? op.bytes / static_cast<double>(n) : 0));
  if (op.peer_bytes && op.peer_bytes->size() == n * n) {
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) bytes[i][j] = (*op.peer_bytes)[i * n + j];
    }
  }
  for (std::size_t i = 0; i < n; ++i) bytes[i][i] = 0;
  return plan_all_to_all(bytes, member_nodes, model, bandwidth_scale);
}

}  // namespace twin::sim

#include "sim/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

namespace twin::sim {

std::string_view to_string(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
    case CollectiveAlgorithm::Auto:
      return "auto";
    case CollectiveAlgorithm::Ring:
      return "ring";
    case CollectiveAlgorithm::Tree:
      return "tree";
    case CollectiveAlgorithm::Hierarchical:
      return "hierarchical";
    case CollectiveAlgorithm::Analytical:
      return "analytical";
  }
  return "?";
}

CollectiveAlgorithm parse_collective_algorithm(std::string_view text) {
  for (auto algorithm : {CollectiveAlgorithm::Auto, CollectiveAlgorithm::Ring, CollectiveAlgorithm::Tree,
                         CollectiveAlgorithm::Hierarchical, CollectiveAlgorithm::Analytical}) {
    if (text == to_string(algorithm)) return algorithm;
  }
  throw std::invalid_argument("unknown collective algorithm '" + std::string(text) +
                              "' (expected auto, ring, tree, hierarchical or analytical)");
}

double CommunicationModel::p2p_latency_s(bool crosses_nodes) const {
  if (ideal) return 0;
  return crosses_nodes ? nccl.ring_simple_net_step_s : nccl.ring_simple_nvlink_step_s;
}

namespace {

// The shape of a group on the machine.
struct Layout {
  int members = 0;
  int nodes = 0;                          // distinct nodes
  int per_node = 0;                       // most members on one node
  bool uniform = true;                    // every node holds per_node members
  std::vector<std::vector<int>> by_node;  // member indices per node, nodes in order of first appearance
};

Layout layout_of(const std::vector<int>& member_nodes) {
  Layout layout;
  layout.members = static_cast<int>(member_nodes.size());
  std::map<int, int> slot;
  for (int member = 0; member < layout.members; ++member) {
    auto [it, inserted] = slot.try_emplace(member_nodes[member], static_cast<int>(layout.by_node.size()));
    if (inserted) layout.by_node.emplace_back();
    layout.by_node[it->second].push_back(member);
  }
  layout.nodes = static_cast<int>(layout.by_node.size());
  for (const auto& members : layout.by_node)
    layout.per_node = std::max(layout.per_node, static_cast<int>(members.size()));
  for (const auto& members : layout.by_node) layout.uniform &= static_cast<int>(members.size()) == layout.per_node;
  return layout;
}

int floor_log2(int value) {
  int result = 0;
  while (value > 1) {
    value /= 2;
    ++result;
  }
  return result;
}

struct Estimate {
  CollectiveAlgorithm algorithm;
  bool low_latency;
  double latency_s;
  double seconds;
};

// NCCL 2.8's ncclTopoTuneModel + ncclTopoGetAlgoTime for this group, with the bus bandwidth of our links: NVLink on
// one node; across nodes min(NVLink, members per node x NIC), NCCL's rings using one channel per NIC.
std::vector<Estimate> nccl_estimates(model::CollectiveKind kind, double bytes, const Layout& g,
                                     const CommunicationModel& model) {
  const NcclLatencies& nccl = model.nccl;
  const double nvlink = model.node.nvlink_effective_bytes_per_s;
  const double nic = model.node.nic_effective_bytes_per_s;
  const bool all_reduce = kind == model::CollectiveKind::AllReduce;
  const int n = g.members, N = g.nodes;
  const double bus = N == 1 ? nvlink : std::min(nvlink, g.per_node * nic);
  const int steps = all_reduce ? 2 * (n - 1) : n - 1;
  const int inter_steps = N == 1 ? 0 : (all_reduce ? 2 * (N - 1) : N - 1);
  const int intra_steps = steps - inter_steps;
  std::vector<Estimate> estimates;
  for (bool ll : {false, true}) {
    const double latency = (ll ? nccl.ring_ll_base_s : nccl.ring_simple_base_s) +
                           intra_steps * (ll ? nccl.ring_ll_nvlink_step_s : nccl.ring_simple_nvlink_step_s) +
                           inter_steps * (ll ? nccl.ring_ll_net_step_s : nccl.ring_simple_net_step_s);
    const double algorithm_bw = bus * (ll ? nccl.ring_ll_bandwidth_fraction : 1.0) * n / steps;
    estimates.push_back({CollectiveAlgorithm::Ring, ll, latency, latency + bytes / algorithm_bw});
  }
  if (all_reduce) {
    for (bool ll : {false, true}) {
      const double intra = ll ? nccl.tree_ll_nvlink_step_s : nccl.tree_simple_nvlink_step_s;
      const double inter = ll ? nccl.tree_ll_net_step_s : nccl.tree_simple_net_step_s;
      const double latency =
          (ll ? nccl.tree_ll_base_s : nccl.tree_simple_base_s) + 2 * ((g.per_node - 1) * intra + floor_log2(N) * inter);
      const double algorithm_bw = bus * (ll ? nccl.tree_ll_bandwidth_fraction : nccl.tree_bandwidth_fraction) * 0.5;
      estimates.push_back({CollectiveAlgorithm::Tree, ll, latency, latency + bytes / algorithm_bw});
    }
  }
  return estimates;
}

double ring_factor(model::CollectiveKind kind, int n) {
  return kind == model::CollectiveKind::AllReduce ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
}

// Rings over all members; with several members per node, one ring (channel) per local index, each entering and
// leaving every node through a different member, each carrying 1/channels of the data.
FlowPhase ring_flows(model::CollectiveKind kind, double bytes, const Layout& g) {
  FlowPhase phase;
  const int channels = g.nodes > 1 ? g.per_node : 1;
  const double per_flow = ring_factor(kind, g.members) * bytes / channels;
  for (int channel = 0; channel < channels; ++channel) {
    std::vector<int> order;
    for (const auto& members : g.by_node) {
      const int size = static_cast<int>(members.size());
      for (int i = 0; i < size; ++i) order.push_back(members[(i + channel) % size]);
    }
    for (int i = 0; i < g.members; ++i) phase.flows.push_back({order[i], order[(i + 1) % g.members], per_flow});
  }
  return phase;
}

// NCCL's double binary tree: tree 1 in member order (parent of i is (i-1)/2), tree 2 mirrored; each carries half,
// reduced up and broadcast down at once (pipelined).
FlowPhase tree_flows(double bytes, int n) {
  FlowPhase phase;
  for (int tree = 0; tree < 2; ++tree) {
    const auto member = [&](int i) { return tree == 0 ? i : n - 1 - i; };
    for (int i = 1; i < n; ++i) {
      const int child = member(i), parent = member((i - 1) / 2);
      phase.flows.push_back({child, parent, bytes / 2});
      phase.flows.push_back({parent, child, bytes / 2});
    }
  }
  return phase;
}

// A ring inside every node (same local rank range) or across nodes (same local index), on `bytes` per member.
FlowPhase intra_node_rings(model::CollectiveKind kind, double bytes, const Layout& g) {
  FlowPhase phase;
  for (const auto& members : g.by_node) {
    const int size = static_cast<int>(members.size());
    if (size < 2) continue;
    for (int i = 0; i < size; ++i) {
      phase.flows.push_back({members[i], members[(i + 1) % size], ring_factor(kind, size) * bytes});
    }
  }
  return phase;
}

FlowPhase inter_node_rings(model::CollectiveKind kind, double bytes, const Layout& g) {
  FlowPhase phase;
  for (int local = 0; local < g.per_node; ++local) {
    for (int node = 0; node < g.nodes; ++node) {
      const int next = (node + 1) % g.nodes;
      phase.flows.push_back({g.by_node[node][local], g.by_node[next][local], ring_factor(kind, g.nodes) * bytes});
    }
  }
  return phase;
}

}  // namespace

CollectivePlan plan_collective(model::CollectiveKind kind, double bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, CollectiveAlgorithm requested, double bandwidth_scale) {
  CollectivePlan plan;
  const Layout g = layout_of(member_nodes);
  if (g.members <= 1 || model.ideal) {
    plan.algorithm = CollectiveAlgorithm::Analytical;
    return plan;  // NCCL with one rank is a no-op; ideal: free
  }
  const bool all_reduce = kind == model::CollectiveKind::AllReduce;
  if (requested == CollectiveAlgorithm::Tree && !all_reduce) requested = CollectiveAlgorithm::Ring;

  // NCCL's choice (or the requested algorithm with its best protocol).
  const std::vector<Estimate> estimates = nccl_estimates(kind, bytes, g, model);
  const Estimate* best = nullptr;
  for (const Estimate& estimate : estimates) {
    const bool allowed = requested == CollectiveAlgorithm::Auto || requested == CollectiveAlgorithm::Analytical ||
                         requested == CollectiveAlgorithm::Hierarchical || estimate.algorithm == requested;
    if (allowed && (best == nullptr || estimate.seconds < best->seconds)) best = &estimate;
  }
  plan.algorithm = best->algorithm;
  plan.low_latency_protocol = best->low_latency;
  plan.estimate_s = best->seconds;
  if (requested == CollectiveAlgorithm::Analytical || bytes < model.small_bytes) {
    plan.algorithm = CollectiveAlgorithm::Analytical;
    return plan;
  }

  const NcclLatencies& nccl = model.nccl;
  const double scaled = bytes * bandwidth_scale;
  const bool hierarchical = requested == CollectiveAlgorithm::Hierarchical ||
                            (requested == CollectiveAlgorithm::Auto && best->algorithm == CollectiveAlgorithm::Ring &&
                             g.nodes > 1 && g.per_node > 1 && g.uniform);
  if (hierarchical && g.nodes > 1 && g.per_node > 1 && g.uniform) {
    // Reduce-scatter in the node, the collective across nodes on 1/g of the data, all-gather in the node.
    plan.algorithm = CollectiveAlgorithm::Hierarchical;
    plan.low_latency_protocol = false;
    const int per_node = g.per_node, nodes = g.nodes;
    const double intra_step = nccl.ring_simple_nvlink_step_s, inter_step = nccl.ring_simple_net_step_s;
    const auto inter_kind = kind;
    const double nvlink = model.node.nvlink_effective_bytes_per_s, nic = model.node.nic_effective_bytes_per_s;
    plan.estimate_s = nccl.ring_simple_base_s;
    if (kind != model::CollectiveKind::AllGather) {
      FlowPhase rs = intra_node_rings(model::CollectiveKind::ReduceScatter, scaled, g);
      rs.latency_s = (per_node - 1) * intra_step;
      plan.estimate_s += rs.latency_s + (per_node - 1.0) / per_node * bytes / nvlink;
      plan.phases.push_back(std::move(rs));
    }
    FlowPhase across = inter_node_rings(inter_kind, scaled / per_node, g);
    const int inter_steps = kind == model::CollectiveKind::AllReduce ? 2 * (nodes - 1) : nodes - 1;
    across.latency_s = inter_steps * inter_step;
    plan.estimate_s += across.latency_s + ring_factor(kind, nodes) * bytes / per_node / nic;
    plan.phases.push_back(std::move(across));
    if (kind != model::CollectiveKind::ReduceScatter) {
      FlowPhase ag = intra_node_rings(model::CollectiveKind::AllGather, scaled, g);
      ag.latency_s = (per_node - 1) * intra_step;
      plan.estimate_s += ag.latency_s + (per_node - 1.0) / per_node * bytes / nvlink;
      plan.phases.push_back(std::move(ag));
    }
    plan.phases.back().latency_s += nccl.ring_simple_base_s;
    return plan;
  }

  // LL moves more bytes on the wire per byte of payload (NCCL's bandwidth fractions).
  double inflation = 1;
  FlowPhase phase;
  if (best->algorithm == CollectiveAlgorithm::Tree) {
    inflation = 1 / (best->low_latency ? nccl.tree_ll_bandwidth_fraction : nccl.tree_bandwidth_fraction);
    phase = tree_flows(scaled * inflation, g.members);
  } else {
    plan.algorithm = CollectiveAlgorithm::Ring;
    inflation = best->low_latency ? 1 / nccl.ring_ll_bandwidth_fraction : 1;
    phase = ring_flows(kind, scaled * inflation, g);
  }
  phase.latency_s = best->latency_s;
  plan.phases.push_back(std::move(phase));
  return plan;
}

}  // namespace twin::sim

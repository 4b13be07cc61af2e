#include "sim/collectives.hpp"

#include "sim/all_to_all.hpp"
#include "sim/measured_tables.hpp"

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
  Protocol protocol;
  double latency_s;
  double seconds;
  double bus_fraction;  // the protocol's bus bandwidth over the links' (the flows carry 1 / this the bytes)
};

// One protocol's step latencies and bus bandwidth in NCCL 2.8.3's model.
struct ProtocolModel {
  Protocol protocol;
  double base_s, nvlink_step_s, net_step_s, bus_bytes_per_s;
};

// NCCL 2.8.3's ncclTopoTuneModel + ncclTopoGetAlgoTime for this group, with the bus bandwidth of our links: NVLink on
// one node; across nodes min(NVLink, members per node x NIC), NCCL's rings using one channel per NIC. The channels
// that cap LL128 and the tree are the tuning graph's: on one node the NVLink ring graph's (half the channels the
// collective runs, ncclTopoPostset doubling them afterwards: hardware.hpp), across nodes one per NIC in use.
std::vector<Estimate> nccl_estimates(model::CollectiveKind kind, double bytes, const Layout& g,
                                     const CommunicationModel& model) {
  const NcclTuning& nccl = model.nccl;
  const double nvlink = model.node.nvlink_effective_bytes_per_s;
  const double nic = model.node.nic_effective_bytes_per_s;
  const bool all_reduce = kind == model::CollectiveKind::AllReduce;
  const int n = g.members, N = g.nodes;
  const double bus = N == 1 ? nvlink : std::min(nvlink, g.per_node * nic);
  const double channels = N == 1 ? std::max(1, model.node.nccl_nvlink_channels / 2) : g.per_node;
  const double ll_max = N == 1   ? nccl.ll_max_bus_single_node_bytes_per_s
                        : N == 2 ? nccl.ll_max_bus_two_nodes_bytes_per_s
                                 : nccl.ll_max_bus_more_nodes_bytes_per_s;
  const double ll128_per_channel = all_reduce ? nccl.ll128_all_reduce_per_channel_bytes_per_s
                                   : kind == model::CollectiveKind::AllGather
                                       ? nccl.ll128_all_gather_per_channel_bytes_per_s
                                       : nccl.ll128_reduce_scatter_per_channel_bytes_per_s;
  const double ll_nvlink_factor = N > 1 ? nccl.ll_multi_node_nvlink_step_factor : 1.0;
  const double ranks_per_node = static_cast<double>(n) / N;
  const int steps = all_reduce ? 2 * (n - 1) : n - 1;
  const int inter_steps = N == 1 ? 0 : (all_reduce ? 2 * (N - 1) : N - 1);
  const int intra_steps = steps - inter_steps;
  std::vector<Estimate> estimates;

  const double ll_fraction =
      N > 1 || all_reduce ? nccl.ring_ll_bandwidth_fraction : nccl.ring_ll_single_node_gather_fraction;
  const double ll128_fraction =
      ranks_per_node < 2 ? nccl.ring_ll128_one_per_node_fraction : nccl.ring_ll128_bandwidth_fraction;
  const ProtocolModel ring[] = {
      {Protocol::Simple, nccl.ring_simple_base_s, nccl.ring_simple_nvlink_step_s, nccl.ring_simple_net_step_s, bus},
      {Protocol::LL, nccl.ring_ll_base_s, nccl.ring_ll_nvlink_step_s * ll_nvlink_factor, nccl.ring_ll_net_step_s,
       std::min(ll_max, bus * ll_fraction)},
      {Protocol::LL128, nccl.ring_ll128_base_s, nccl.ring_ll128_nvlink_step_s, nccl.ring_ll128_net_step_s,
       std::min(bus * ll128_fraction, ll128_per_channel * channels)},
  };
  for (const ProtocolModel& p : ring) {
    const double latency = p.base_s + intra_steps * p.nvlink_step_s + inter_steps * p.net_step_s;
    const double algorithm_bw = p.bus_bytes_per_s * n / steps;
    estimates.push_back({CollectiveAlgorithm::Ring, p.protocol, latency, latency + bytes / algorithm_bw,
                         p.bus_bytes_per_s / bus});
  }
  if (all_reduce) {
    const double tree_max_per_channel = N == 1   ? nccl.tree_max_single_node_per_channel_bytes_per_s
                                        : N == 2 ? nccl.tree_max_two_nodes_per_channel_bytes_per_s
                                                 : nccl.tree_max_more_nodes_per_channel_bytes_per_s;
    const double tree_bus = std::min(bus * nccl.tree_bandwidth_fraction, channels * tree_max_per_channel);
    const double ll128_tree_fraction =
        N == 1 ? nccl.tree_ll128_single_node_fraction : nccl.tree_ll128_bandwidth_fraction;
    const ProtocolModel tree[] = {
        {Protocol::Simple, nccl.tree_simple_base_s, nccl.tree_simple_nvlink_step_s, nccl.tree_simple_net_step_s,
         tree_bus},
        {Protocol::LL, nccl.tree_ll_base_s, nccl.tree_ll_nvlink_step_s * ll_nvlink_factor, nccl.tree_ll_net_step_s,
         std::min(tree_bus * nccl.tree_ll_bandwidth_fraction, ll_max)},
        {Protocol::LL128, nccl.tree_ll128_base_s, nccl.tree_ll128_nvlink_step_s, nccl.tree_ll128_net_step_s,
         std::min(tree_bus * ll128_tree_fraction, ll128_per_channel * channels)},
    };
    for (const ProtocolModel& p : tree) {
      const double latency = p.base_s + 2 * ((g.per_node - 1) * p.nvlink_step_s + floor_log2(N) * p.net_step_s);
      const double algorithm_bw = p.bus_bytes_per_s * 0.5;
      estimates.push_back({CollectiveAlgorithm::Tree, p.protocol, latency, latency + bytes / algorithm_bw,
                           p.bus_bytes_per_s / bus});
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

namespace {

// The time OpenXLA measured for this collective of `members` GPUs inside one node of the GPU's
// (sim/data/collectives_by_size.csv) on `bytes` as twin counts them (the whole tensor: an all-reduce's, a
// reduce-scatter's input, an all-gather's output, as XLA's benchmark does); 0 where none was measured. Its small
// sizes carry NCCL's real latency, its large ones a rate under the bus-bandwidth model (8 H100: an all-gather of
// 64 MiB in 0.20 ms where the ring model gives 0.15 ms).
double measured_floor_s(model::CollectiveKind kind, double bytes, int members, const CommunicationModel& model) {
  const char* name = kind == model::CollectiveKind::AllReduce       ? "all-reduce"
                     : kind == model::CollectiveKind::AllGather     ? "all-gather"
                     : kind == model::CollectiveKind::ReduceScatter ? "reduce-scatter"
                                                                    : nullptr;
  const CollectiveTable* table = name ? collective_table(model.node.gpu.name, name, members) : nullptr;
  return table ? table->seconds(bytes) : 0;
}

}  // namespace

CollectivePlan plan_collective(model::CollectiveKind kind, double bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, CollectiveAlgorithm requested, double bandwidth_scale) {
  if (kind == model::CollectiveKind::AllToAll) {  // its bytes spread evenly over the members
    const auto n = member_nodes.size();
    std::vector<std::vector<double>> even(n, std::vector<double>(n, n > 0 ? bytes / static_cast<double>(n) : 0));
    for (std::size_t i = 0; i < n; ++i) even[i][i] = 0;
    return plan_all_to_all(even, member_nodes, model, bandwidth_scale);
  }
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
  plan.protocol = best->protocol;
  // Inside one node, no faster than the collective measured there (measured_floor_s).
  const double floor_s = g.nodes == 1 ? measured_floor_s(kind, bytes, g.members, model) : 0;
  plan.estimate_s = std::max(best->seconds, floor_s);
  if (requested == CollectiveAlgorithm::Analytical || bytes < model.small_bytes) {
    plan.algorithm = CollectiveAlgorithm::Analytical;
    return plan;
  }

  const NcclTuning& nccl = model.nccl;
  const double scaled = bytes * bandwidth_scale;
  const bool hierarchical = requested == CollectiveAlgorithm::Hierarchical ||
                            (requested == CollectiveAlgorithm::Auto && best->algorithm == CollectiveAlgorithm::Ring &&
                             g.nodes > 1 && g.per_node > 1 && g.uniform);
  if (hierarchical && g.nodes > 1 && g.per_node > 1 && g.uniform) {
    // Reduce-scatter in the node, the collective across nodes on 1/g of the data, all-gather in the node.
    plan.algorithm = CollectiveAlgorithm::Hierarchical;
    plan.protocol = Protocol::Simple;
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

  // A protocol (and the tree) that reaches less than the links' bus bandwidth in NCCL's model moves the bytes as if
  // there were 1 / bus_fraction times as many of them.
  const double inflation = 1 / best->bus_fraction;
  FlowPhase phase;
  if (best->algorithm == CollectiveAlgorithm::Tree) {
    phase = tree_flows(scaled * inflation, g.members);
  } else {
    plan.algorithm = CollectiveAlgorithm::Ring;
    phase = ring_flows(kind, scaled * inflation, g);
  }
  phase.latency_s = best->latency_s;
  phase.min_s = std::max(phase.min_s, floor_s - phase.latency_s);
  plan.phases.push_back(std::move(phase));
  return plan;
}

double exposed_beside_gemm_s(double collective_s, double gemm_s, double sm_share) {
  if (collective_s <= 0) return 0;
  if (gemm_s <= 0) return collective_s;
  return std::max(collective_s - gemm_s, std::clamp(sm_share, 0.0, 1.0) * collective_s);
}

}  // namespace twin::sim

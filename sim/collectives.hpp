// Collectives decomposed into flows, as NCCL runs them, and NCCL's own latency model.
//
// Algorithms (bytes S per member, n members):
//   ring          one phase: member i sends to member i+1 (mod n) 2(n-1)/n S (all-reduce) or (n-1)/n S (reduce-scatter,
//                 all-gather), all n flows at once (the fluid limit of NCCL's pipelined ring).
//   tree          all-reduce over NCCL's double binary tree: each tree carries S/2, reduced up and broadcast down,
//                 pipelined, so every tree edge carries S/2 each way at once.
//   hierarchical  members on several nodes with several per node: reduce-scatter inside each node (NVLink ring),
//                 then one ring per local index across nodes on S/g (each over its own NICs), then all-gather inside
//                 each node; three phases.
//   auto          NCCL's choice: ring or tree by NCCL's time estimate for all-reduce, hierarchical instead of a flat
//                 ring when members share nodes and span several; collectives under `small_bytes` are latency bound
//                 and timed by the estimate alone (no flows).
// Latency: NCCL 2.8's model (src/graph/tuning.cc), added once per phase: base latency of the algorithm + per step
// hardware latency (NVLink or network), e.g. a ring all-reduce pays 2(n-1) steps.
#pragma once

#include <string_view>
#include <vector>

#include "model/program.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {

enum class CollectiveAlgorithm : unsigned char { Auto, Ring, Tree, Hierarchical, Analytical };
std::string_view to_string(CollectiveAlgorithm algorithm);
CollectiveAlgorithm parse_collective_algorithm(std::string_view text);  // throws std::invalid_argument

// NCCL 2.8, src/graph/tuning.cc (the release MT-NLG trained with), microseconds converted to seconds.
struct NcclLatencies {
  // baseLat: Tree {LL 4.4, LL128 4.4, Simple 0}, Ring {LL 3.6, LL128 10.0, Simple 8.4}.
  double ring_simple_base_s = 8.4e-6;
  double ring_ll_base_s = 3.6e-6;
  double tree_ll_base_s = 4.4e-6;
  double tree_simple_base_s = 0;
  // hwLat NVLINK: Tree {.52, 1.2, 28}, Ring {.47, 1.9, 3.4}; NET: Tree {5.0, 8.5, 50}, Ring {2.7, 4.0, 9.6}.
  double ring_simple_nvlink_step_s = 3.4e-6;
  double ring_simple_net_step_s = 9.6e-6;
  double ring_ll_nvlink_step_s = 0.47e-6;
  double ring_ll_net_step_s = 2.7e-6;
  double tree_simple_nvlink_step_s = 28e-6;
  double tree_simple_net_step_s = 50e-6;
  double tree_ll_nvlink_step_s = 0.52e-6;
  double tree_ll_net_step_s = 5.0e-6;
  // Bandwidth model: LL moves a quarter of the ring's bus bandwidth ("busBw *= 1.0/4.0"), the tree 0.9 of it
  // ("busBw*.9") and LL on a tree 1/3.8 of that.
  double ring_ll_bandwidth_fraction = 1.0 / 4.0;
  double tree_bandwidth_fraction = 0.9;
  double tree_ll_bandwidth_fraction = 0.9 / 3.8;
};

struct CommunicationModel {
  topology::NodeSpec node;
  NcclLatencies nccl;
  double small_bytes = 64 * 1024;  // below: latency-bound, timed by NCCL's estimate without flows
  bool ideal = false;              // infinite bandwidth, zero latency (tests of the pipeline alone)

  // One point-to-point message: NCCL's ring Simple step latency of the link class (Send/Recv use the Simple
  // protocol), the hardware route latency being added by the engine.
  double p2p_latency_s(bool crosses_nodes) const;
};

struct Flow {
  int from = 0;  // member indices
  int to = 0;
  double bytes = 0;
};

struct FlowPhase {
  std::vector<Flow> flows;
  double latency_s = 0;  // paid after the phase's flows complete
};

struct CollectivePlan {
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::Ring;
  bool low_latency_protocol = false;  // NCCL's LL protocol (small messages)
  std::vector<FlowPhase> phases;      // empty: `estimate_s` is the whole time
  double estimate_s = 0;              // NCCL-style estimate without contention
};

// `member_nodes[i]`: the node of member i (members in group order). `bytes`: per member, as Op::bytes.
// `bandwidth_scale`: a group-fidelity member stands for that many rail-parallel ranks (the flows carry that many
// times the bytes over bundled links; the estimate is unchanged).
CollectivePlan plan_collective(model::CollectiveKind kind, double bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, CollectiveAlgorithm requested,
                               double bandwidth_scale = 1);

}  // namespace twin::sim

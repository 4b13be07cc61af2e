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
// Latency: NCCL 2.8.3's model (src/graph/tuning.cc), added once per phase: base latency of the algorithm and
// protocol + per step hardware latency (NVLink or network), e.g. a ring all-reduce pays 2(n-1) steps. Protocol: the
// one NCCL's estimate picks; LL, LL128 and the tree reach less than the links' bus bandwidth in that model, and their
// flows carry the bytes scaled up by the ratio.
#pragma once

#include <string_view>
#include <vector>

#include "model/program/program.hpp"
#include "topology/hardware.hpp"

namespace twin::sim {

enum class CollectiveAlgorithm : unsigned char { Auto, Ring, Tree, Hierarchical, Analytical };
std::string_view to_string(CollectiveAlgorithm algorithm);
CollectiveAlgorithm parse_collective_algorithm(std::string_view text);  // throws std::invalid_argument

// NCCL's protocols: Simple (large messages), LL (8-byte flag+data stores, lowest latency, a quarter of the
// bandwidth) and LL128 (128-byte lines with one flag word: near Simple's bandwidth at lower latency; NCCL enables it
// by default on Volta and Ampere with NVLink).
enum class Protocol : unsigned char { Simple, LL, LL128 };

// NCCL 2.8.3's tuning model (src/graph/tuning.cc at tag v2.8.3-1, the release of NGC PyTorch 20.12 and of the runs
// of 2021), microseconds converted to seconds and GB/s to bytes/s.
struct NcclTuning {
  // baseLat: Tree {LL 4.4, LL128 4.4, Simple 0}, Ring {LL 3.6, LL128 10.0, Simple 8.4}.
  double ring_simple_base_s = 8.4e-6;
  double ring_ll_base_s = 3.6e-6;
  double ring_ll128_base_s = 10.0e-6;
  double tree_simple_base_s = 0;
  double tree_ll_base_s = 4.4e-6;
  double tree_ll128_base_s = 4.4e-6;
  // hwLat NVLINK: Tree {.52, 1.25, 28}, Ring {.47, 1.9, 3.4}; NET: Tree {5.0, 8.5, 28}, Ring {2.7, 4.0, 9.6}. An LL
  // step inside a node counts 1.8 times when the group spans nodes ("intraLat *= 1.8").
  double ring_simple_nvlink_step_s = 3.4e-6;
  double ring_simple_net_step_s = 9.6e-6;
  double ring_ll_nvlink_step_s = 0.47e-6;
  double ring_ll_net_step_s = 2.7e-6;
  double ring_ll128_nvlink_step_s = 1.9e-6;
  double ring_ll128_net_step_s = 4.0e-6;
  double tree_simple_nvlink_step_s = 28e-6;
  double tree_simple_net_step_s = 28e-6;
  double tree_ll_nvlink_step_s = 0.52e-6;
  double tree_ll_net_step_s = 5.0e-6;
  double tree_ll128_nvlink_step_s = 1.25e-6;
  double tree_ll128_net_step_s = 8.5e-6;
  double ll_multi_node_nvlink_step_factor = 1.8;
  // Bandwidth refinements of the bus bandwidth (nChannels x speed, at most 235 GB/s on sm80):
  //   ring LL: x 1/4 (1/3 for an all-gather or reduce-scatter inside one node), at most llMaxBws;
  //   ring LL128: x 0.92 (0.7 with fewer than two ranks per node), at most ll128MaxBwPerCh x nChannels;
  //   tree: x 0.92, at most nChannels x perChMaxTreeBws; then LL x 1/3.8 (at most llMaxBws), LL128 x 7/9 on one
  //   node or 0.915 across nodes (at most ll128MaxBwPerCh x nChannels).
  double ring_ll_bandwidth_fraction = 1.0 / 4.0;
  double ring_ll_single_node_gather_fraction = 1.0 / 3.0;
  double ring_ll128_bandwidth_fraction = 0.92;
  double ring_ll128_one_per_node_fraction = 0.7;
  double tree_bandwidth_fraction = 0.92;
  double tree_ll_bandwidth_fraction = 1.0 / 3.8;
  double tree_ll128_single_node_fraction = 7.0 / 9.0;
  double tree_ll128_bandwidth_fraction = 0.915;
  // llMaxBws, Ampere on one node, then AMD hosts (DGX A100's EPYC 7742) on 2 and on more nodes: 87.7, 22.5, 19.0.
  double ll_max_bus_single_node_bytes_per_s = 87.7e9;
  double ll_max_bus_two_nodes_bytes_per_s = 22.5e9;
  double ll_max_bus_more_nodes_bytes_per_s = 19.0e9;
  // ll128MaxBwPerCh: all-gather 18.3, reduce-scatter 15.2, all-reduce 16.9 (broadcast 18.8, reduce 12.0).
  double ll128_all_gather_per_channel_bytes_per_s = 18.3e9;
  double ll128_reduce_scatter_per_channel_bytes_per_s = 15.2e9;
  double ll128_all_reduce_per_channel_bytes_per_s = 16.9e9;
  // perChMaxTreeBws, Ampere, on 1 / 2 / more nodes: 24.0, 22.5, 16.0.
  double tree_max_single_node_per_channel_bytes_per_s = 24.0e9;
  double tree_max_two_nodes_per_channel_bytes_per_s = 22.5e9;
  double tree_max_more_nodes_per_channel_bytes_per_s = 16.0e9;
};

struct CommunicationModel {
  topology::NodeSpec node;
  NcclTuning nccl;
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
  double min_s = 0;      // the phase lasts at least this long before its latency (bytes timed without flows)
};

struct CollectivePlan {
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::Ring;
  Protocol protocol = Protocol::Simple;
  std::vector<FlowPhase> phases;      // empty: `estimate_s` is the whole time
  double estimate_s = 0;              // NCCL-style estimate without contention
};

// `member_nodes[i]`: the node of member i (members in group order). `bytes`: per member, as Op::bytes.
// `bandwidth_scale`: a group-fidelity member stands for that many rail-parallel ranks (the flows carry that many
// times the bytes over bundled links; the estimate is unchanged).
CollectivePlan plan_collective(model::CollectiveKind kind, double bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, CollectiveAlgorithm requested,
                               double bandwidth_scale = 1);

// framework.tp_comm_overlap (model/ops/tp_overlap.hpp): the time a collective of `collective_s` adds to a GEMM of `gemm_s`
// it runs beside, when the collective's thread blocks hold `sm_share` of the SMs meanwhile (NCCL launches one block
// per channel, and a cuBLAS GEMM block does not fit beside one: NVIDIA Developer Forums, "Compute-Communication
// Overlap Causes Severe GEMM Performance Degradation because of Tail Effect", 2025, profiles an all-gather's 24 blocks
// pushing a 132-block GEMM into a second wave on an H100): the GEMM advances at 1 - sm_share while the collective
// runs, so the pair takes max(collective, gemm + sm_share x collective), i.e. max(collective - gemm, sm_share x
// collective) past the GEMM. The GEMM's wave quantization on the SMs left is not modelled.
double exposed_beside_gemm_s(double collective_s, double gemm_s, double sm_share);

}  // namespace twin::sim

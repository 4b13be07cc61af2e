// The token all-to-all of a Mixture-of-Experts layer (dispatch and combine) as flows: every member sends each other
// member its share at once, as NCCL runs an all-to-all (one ncclSend and one ncclRecv per peer inside a group call;
// Megatron-Core's all_to_all goes through torch.distributed.all_to_all_single, which NCCL runs so).
//
// On the platform (topology/platform.hpp) a flow between two GPUs of a node crosses their NVLink ports through the
// NVSwitch; a flow between nodes leaves through the sender's NIC and enters through the receiver's, across the
// fat-tree. So a member's intra-node bytes share its NVLink port, its inter-node bytes its NIC (and the NICs a node
// shares when cluster.nics_per_node is below its GPUs), and members whose EP group spans nodes feel the fabric.
// Latency: one NCCL Simple step of the slowest link class the exchange crosses (the peers' sends are concurrent),
// plus NCCL's base latency, from the tuning model of sim/collectives.hpp.
#pragma once

#include <vector>

#include "sim/collectives.hpp"

namespace twin::sim {

// How an all-to-all's bytes become flows.
//   PerPair      one flow per pair of members (rank fidelity: what NCCL runs).
//   PerNodePair  group fidelity: the bytes a member sends inside its node cross only NVLink ports (through the
//                NVSwitch), which nothing else uses in Megatron's placement, as for TP collectives: they are timed,
//                not flowed (the phase lasts at least the busiest port's bytes at its rate, FlowPhase::min_s), and an
//                all-to-all inside one node has no flows at all (its estimate). Between two nodes, at most
//                2g - 1 flows (g members a node) carry what each member sends to and receives from the other node
//                (the north-west corner rule of the transportation problem), so every member's NIC and every node's
//                fabric links carry what they did with g x g flows. Balanced routing gives g flows, slot to slot.
//                What it leaves out: an overlapped data-parallel collective's NVLink phase no longer shares the
//                ports with the tokens, and SimGrid's sharing among fewer, larger flows (the same link loads) may end
//                a skewed exchange at another time than the pairwise flows (docs/simulator.md gives the measured
//                differences).
enum class AllToAllFlows : unsigned char { PerPair, PerNodePair };

// `bytes[i][j]`: what member i sends member j (the diagonal stays local: no flow); `member_nodes[i]`: member i's node.
// `bandwidth_scale`: a group-fidelity member stands for that many rail-parallel ranks (flows carry that many times
// the bytes over bundled links; the estimate is unchanged). One phase of flows; `estimate_s` is the time on an idle
// network (each member's NVLink and NIC bytes at their rates, the slowest member setting it).
CollectivePlan plan_all_to_all(const std::vector<std::vector<double>>& bytes, const std::vector<int>& member_nodes,
                               const CommunicationModel& model, double bandwidth_scale = 1,
                               AllToAllFlows flows = AllToAllFlows::PerPair);

// The plan of one collective op of the Program: an all-to-all by its per-peer sizes (Op::peer_bytes; Op::bytes
// spread evenly over the members when it has none, or when its members are not the group's), any other kind by
// plan_collective.
CollectivePlan plan_op_collective(const model::Op& op, const std::vector<int>& member_nodes,
                                  const CommunicationModel& model, CollectiveAlgorithm requested,
                                  double bandwidth_scale = 1, AllToAllFlows flows = AllToAllFlows::PerPair);

// Group fidelity, where an actor stands for several ranks of the all-to-all's group (a TP group holding several EP
// ranks): the estimate and the NVLink time are the ranks' own (the busiest rank, e.g. the hottest EP rank under
// model.expert_load_skew, setting them), and the bytes across nodes are the ranks' summed per pair of actors (each
// actor's bundled links carry its ranks' bytes together), moved per node pair as above. `rank_nodes[i]`: the node of
// the group's rank i; `actor_of_rank[i]`: its actor's index among the members, whose nodes are `actor_nodes`.
CollectivePlan plan_all_to_all_of_actors(const model::Op& op, const std::vector<int>& rank_nodes,
                                         const std::vector<int>& actor_of_rank, const std::vector<int>& actor_nodes,
                                         const CommunicationModel& model);

}  // namespace twin::sim

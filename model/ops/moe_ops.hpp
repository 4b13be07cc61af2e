// The Mixture-of-Experts MLP of one transformer layer for one micro-batch on one rank, as Megatron-Core runs it with
// its all-to-all token dispatcher (megatron/core/transformer/moe/: router.py, token_dispatcher.py
// MoEAlltoAllTokenDispatcher, experts.py GroupedMLP / TEGroupedMLP, shared_experts.py):
//   forward   router GEMM -> top-k softmax and permutation -> all-to-all dispatch over the Expert group
//             [-> all-gather over ExpertTensor] -> grouped up GEMMs -> activation -> grouped down GEMMs
//             [-> reduce-scatter over ExpertTensor] -> all-to-all combine -> unpermute; shared experts beside them
//   backward  the same in reverse, each all-to-all its own adjoint (the gradients travel back the way the rows came).
// The layer's input stays where the attention block left it (sequence shards under sequence parallelism): T tokens
// per rank, each routed to top_k experts, so T x top_k rows leave every rank.
//
// The load model (model.expert_load_skew = s): expert i (0-based) receives a share 1/(i+1)^s of the rows, normalized;
// s = 0 is balanced routing. Experts sit on EP ranks in order (EP rank r holds experts r E/ep .. (r+1) E/ep - 1), and
// every rank routes its tokens alike, so EP rank 0 receives the most. A rank's expert ops carry the hottest EP rank's
// rows: the combine all-to-all cannot finish before that rank's experts, so it sets every member's pace.
#pragma once

#include <memory>
#include <vector>

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

struct Shapes;  // model/ops/kernel_traffic.hpp

// Each expert's share of the routed rows (sums to 1), less what its capacity drops: with model.capacity_factor = c > 0
// an expert takes at most c / experts of them and the rest are dropped before the dispatch (Megatron-Core's token
// drop); with model.pad_to_capacity every expert takes exactly c / experts (--moe-pad-expert-input-to-capacity: the
// shares then sum to c).
std::vector<double> expert_row_shares(const Scenario& s);

// The rows each EP rank's experts receive from one rank's T x top_k, as shares of it (sums to 1 over the EP ranks
// when nothing is dropped).
std::vector<double> ep_rank_row_shares(const Scenario& s);

// Bytes EP member i sends member j in one dispatch ([i * ep + j]; what combine sends back is its transpose), e x hidden
// bytes a row. The all-to-all dispatcher: member j's rows for j's experts, one per (token, expert). The flex one
// (framework.moe_dispatcher = "flex", DeepEP / HybridEP): a token once to each member of its own node that holds any
// of its experts, and once to each other node that does (spread over that node's members), EP members consecutive
// on the nodes, gpus_per_node of them to a node.
std::shared_ptr<const std::vector<double>> dispatch_peer_bytes(const Scenario& s, double rows_per_rank,
                                                               double row_bytes);

// The chance that a token's top_k choices reach a set of experts that receives `share` of the routed rows, its hottest
// expert `hottest_expert_share` of them: 1 - the chance that k draws without replacement from the E experts all miss
// its share x E of them (balanced routing: the hypergeometric 1 - C(E - m, k) / C(E, k) for a set of m experts),
// within what a token picking an expert at most once allows: at least k x hottest_expert_share (exact for one
// expert), at most k x share.
double flex_reach(const Scenario& s, double share, double hottest_expert_share);

// Whether framework.moe_dispatcher = "flex" sends what the all-to-all dispatcher does on this plan (ep = 1: nothing to
// either; one expert per EP rank in one node: a token reaches each rank at most once either way), by comparing the two
// dispatch_peer_bytes: what twin sim says in a note rather than let the key do nothing silently.
bool flex_dispatch_changes_nothing(const Scenario& s);

// ---- Parameters (Megatron-Core's GroupedMLP: each routed expert an up and a down projection; the router's [E, h]
// weight; the shared experts one MLP of their summed width, split over TP as a dense MLP)

// One routed expert's weights: its up projection (twice the width with SwiGLU) and down projection, with their biases
// under model.linear_bias.
double expert_parameters(const Scenario& s);
// The routed experts' parameters one GPU holds in one MoE layer: experts / ep of them, each split over etp.
double expert_parameters_per_gpu(const Scenario& s);
// An MoE layer's other parameters one GPU holds (attention, norms, router, shared experts): what reduces over DP.
double moe_layer_dense_parameters_per_gpu(const Scenario& s);
// Transformer layer `layer`'s parameters one GPU holds apart from routed experts (dense layers: all of them).
double layer_dense_parameters_per_gpu(const Scenario& s, std::int64_t layer);

// The model's parameters, counted once, and those one token runs through (top_k of each MoE layer's routed experts;
// the dense model's both).
struct MoeParameterCount {
  double total = 0;
  double active = 0;
};
MoeParameterCount count_moe_parameters(const Scenario& s);

// The MoE MLP's ops between the MLP's layer norm and its residual add, in `phase` (Forward, Recompute, Backward).
std::vector<Op> moe_mlp_ops(const Scenario& s, const Shapes& x, Phase phase);

}  // namespace twin::model

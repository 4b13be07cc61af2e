// Mixture-of-Experts kernels: the router's top-k, the auxiliary load-balancing loss, token permutation, and the
// experts' grouped GEMM, forward and backward. They follow Megatron-Core's MoE layer (megatron/core/transformer/moe/:
// router.py, moe_utils.py, token_dispatcher.py, experts.py) with its defaults: softmax scores, top-k on the logits
// then a softmax over the k chosen (moe_router_pre_softmax off), probabilities applied when tokens are unpermuted,
// dropless unless a capacity drops (moe_capacity_drop). The router GEMM itself is matmul_forward (logits = x @
// router_weight^T, no bias).
//
// The data flow of one MoE layer on one rank (T tokens, E experts, k = top_k, C = hidden):
//   logits (T, E) -> moe_topk_softmax_forward -> probs (T, k), experts (T, k)
//   experts -> moe_permutation -> rows (T, k): where each (token, slot) goes; rows_per_expert (E)
//   x (T, C) -> moe_permute_forward -> expert-major rows (T k, C) -> [all-to-all, moe_sort_chunks_forward]
//            -> moe_grouped_matmul_forward (fc1) -> activation -> moe_grouped_matmul_forward (fc2)
//            -> [moe_sort_chunks_backward's inverse order, all-to-all] -> moe_unpermute_forward (weights by probs)
//   logits -> moe_router_scores_forward -> scores (T, E) -> moe_aux_loss_forward (with the counts of the whole
//   micro-batch: moe_tokens_per_expert summed over the sequence shards)
// Expert and token indices are int; counts that travel through float collectives are float (exact below 2^24).
#pragma once

namespace twin::kernels::cpu {

// ---- Routing -----------------------------------------------------------------------------------------------------

// probs (tokens, top_k), experts (tokens, top_k) <- logits (tokens, num_experts): each token's top_k largest logits
// (slot 0 the largest; equal logits: the lower expert first), and a softmax over those top_k logits.
void moe_topk_softmax_forward(float* probs, int* experts, const float* logits, int tokens, int num_experts, int top_k);

// dlogits (tokens, num_experts) <- the softmax's backward on each token's chosen columns, 0 on the others:
//   dlogits[t, experts[t, j]] = probs[t, j] (dprobs[t, j] - sum_i probs[t, i] dprobs[t, i])
// OVERWRITES dlogits (moe_aux_loss_backward then accumulates into it).
void moe_topk_softmax_backward(float* dlogits, const float* dprobs, const float* probs, const int* experts, int tokens,
                               int num_experts, int top_k);

// ---- Load-balancing loss (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961; Megatron-Core's
// switch_load_balancing_loss_func and compute_routing_scores_for_aux_loss) ---------------------------------------

// scores (tokens, num_experts) <- softmax of each row of logits over every expert.
void moe_router_scores_forward(float* scores, const float* logits, int tokens, int num_experts);

// counts (num_experts) <- how many (token, slot) pairs chose each expert. OVERWRITES counts.
void moe_tokens_per_expert(float* counts, const int* experts, int tokens, int num_experts, int top_k);

// The loss of this rank's tokens:
//   loss = coeff * E / (k * T^2) * sum_i counts[i] * sum_{t < tokens} scores[t, i]
// where counts and T = total_tokens cover the whole micro-batch (summed over its sequence shards: TP with sequence
// parallelism, CP) and scores only this rank's tokens; the shards' losses sum to the micro-batch's.
double moe_aux_loss_forward(const float* scores, const float* counts, int tokens, int num_experts, int top_k,
                            double total_tokens, double coeff);

// dlogits (tokens, num_experts) += d(loss_grad * loss) / d logits, through the softmax of the scores (counts come
// from the top-k choice: no gradient). ACCUMULATES.
void moe_aux_loss_backward(float* dlogits, const float* scores, const float* counts, int tokens, int num_experts,
                           int top_k, double total_tokens, double coeff, double loss_grad);

// ---- Token dropping (Megatron-Core's apply_router_token_dropping and get_capacity in moe_utils.py, called by
// TopKRouter.routing in router.py on the rank's own tokens after the top-k; read at NVIDIA/Megatron-LM commit
// 00611e6eeb0b09b5ee074750956855215ddbd67f): moe_token_drop_policy "probs" (the default), no padding to capacity
// (moe_pad_expert_input_to_capacity: padded rows are zeros, numerically nothing; not implemented) ---------------

// A dropped (token, slot): its expert in `experts` and its row in `rows`. It has no row in the permuted buffer,
// adds nothing to its token's output and gets no gradient (its probability's included).
inline constexpr int kMoeDropped = -1;

// Rows an expert takes: get_capacity(num_tokens = tokens * top_k, num_experts, capacity_factor) =
// ceil(tokens * top_k / num_experts * capacity_factor), at most `tokens` (no expert can be chosen more often).
int moe_capacity(int tokens, int num_experts, int top_k, double capacity_factor);

// experts (tokens, top_k): each expert keeps the `capacity` of its (token, slot) pairs with the highest probs
// (tokens, top_k), the others become kMoeDropped. Equal probabilities: the earlier token is kept (torch.topk leaves
// the order of ties unspecified; this one is deterministic). Returns how many pairs it dropped.
int moe_capacity_drop(int* experts, const float* probs, int tokens, int num_experts, int top_k, int capacity);

// ---- Permutation (Megatron-Core's permute / unpermute: expert-major, tokens in order within an expert) ----------
// A row of kMoeDropped (from an expert of kMoeDropped) is skipped by every function below.

// rows (tokens, top_k) <- the row of the permuted buffer each (token, slot) goes to (kMoeDropped for a dropped one);
// rows_per_expert (num_experts) <- the rows of each expert, which sit together in expert order (their sum, at most
// tokens * top_k, is the permuted buffer's row count).
void moe_permutation(int* rows, int* rows_per_expert, const int* experts, int tokens, int num_experts, int top_k);

// out (tokens * top_k, hidden): out[rows[t, j]] = inp[t] (inp (tokens, hidden)). OVERWRITES out's rows.
void moe_permute_forward(float* out, const float* inp, const int* rows, int tokens, int hidden, int top_k);
// dinp (tokens, hidden) = sum over kept j (in slot order) of dout[rows[t, j]]. OVERWRITES dinp.
void moe_permute_backward(float* dinp, const float* dout, const int* rows, int tokens, int hidden, int top_k);

// out (tokens, hidden) = sum over kept j (in slot order) of probs[t, j] * inp[rows[t, j]] (inp (tokens * top_k,
// hidden)). OVERWRITES out.
void moe_unpermute_forward(float* out, const float* inp, const float* probs, const int* rows, int tokens, int hidden,
                           int top_k);
// dinp (tokens * top_k, hidden): dinp[rows[t, j]] = probs[t, j] * dout[t]; dprobs (tokens, top_k): dprobs[t, j] =
// dout[t] . inp[rows[t, j]], 0 for a dropped slot. Both OVERWRITTEN.
void moe_unpermute_backward(float* dinp, float* dprobs, const float* dout, const float* inp, const float* probs,
                            const int* rows, int tokens, int hidden, int top_k);

// ---- After the all-to-all: regroup the rows by local expert (Megatron-Core's sort_chunks_by_idxs) ----------------

// inp holds `chunks` consecutive chunks of rows, chunk c of chunk_rows[c] rows (hidden wide); out holds the same
// chunks in the order `order`: out's chunk i is inp's chunk order[i]. OVERWRITES out; out must not alias inp.
void moe_sort_chunks_forward(float* out, const float* inp, const int* chunk_rows, const int* order, int chunks,
                             int hidden);
// Its backward (and inverse): dinp's chunk order[i] = dout's chunk i (chunk_rows and order as in the forward).
void moe_sort_chunks_backward(float* dinp, const float* dout, const int* chunk_rows, const int* order, int chunks,
                              int hidden);

// ---- Experts: one GEMM per expert over its consecutive rows (Megatron-Core's GroupedMLP / TEGroupedMLP) ----------

// out (rows, out_features): each group g's rows_per_group[g] consecutive rows of inp (rows, in_features) times
// weights[g]^T, weights (groups, out_features, in_features) (nn.Linear's layout, no bias); rows = sum of
// rows_per_group. A group with no rows is skipped. OVERWRITES out.
void moe_grouped_matmul_forward(float* out, const float* inp, const float* weights, const int* rows_per_group,
                                int groups, int in_features, int out_features);
// dinp (rows, in_features) = dout @ weights[g] per group, OVERWRITTEN (nullptr: not computed); dweights (groups,
// out_features, in_features) += dout^T @ inp per group, ACCUMULATED (a group with no rows adds nothing).
void moe_grouped_matmul_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                                 const float* weights, const int* rows_per_group, int groups, int in_features,
                                 int out_features);

}  // namespace twin::kernels::cpu

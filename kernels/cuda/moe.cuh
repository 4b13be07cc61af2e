// Mixture-of-Experts kernels on the device, twins of kernels/cpu/moe.hpp (same names and argument order, plus the
// stream and, for the GEMMs, the Cublas handle): the router's top-k softmax and scores (one thread per token, the
// formulas of moe_math.hpp), the load-balancing loss's column sums, token permutation with the probabilities, the
// chunk sort after the all-to-all, and the experts' grouped GEMM as one cuBLASLt GEMM per expert on its row range
// (what the cost model assumes: docs/accuracy.md, "One GEMM launch per local expert"), experts with no rows skipped.
// Logits, token rows and their gradients bf16; probabilities, scores and their gradients fp32; expert indices and row
// maps int32 on the device; chunk and group sizes on the host (the counts Megatron-Core syncs to the host).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

class Cublas;

// ---- Routing -----------------------------------------------------------------------------------------------------

// probs (tokens, top_k) fp32, experts (tokens, top_k) int32 <- logits (tokens, num_experts): each token's top_k
// largest logits (slot 0 the largest; equal logits: the lower expert first) and a softmax over them.
void moe_topk_softmax_forward(float* probs, int* experts, const __nv_bfloat16* logits, int tokens, int num_experts,
                              int top_k, cudaStream_t stream);

// scores (tokens, num_experts) fp32 <- softmax of each row of logits over every expert.
void moe_router_scores_forward(float* scores, const __nv_bfloat16* logits, int tokens, int num_experts,
                               cudaStream_t stream);

// sums (num_experts) fp64 <- sum over tokens of scores[t, e], each a block's fixed-order reduction (the
// load-balancing loss is then moe_math::aux_loss on the host, with the micro-batch's counts).
void moe_score_sums(double* sums, const float* scores, int tokens, int num_experts, cudaStream_t stream);

// dlogits (tokens, num_experts) OVERWRITTEN, rounded once to bf16 <- the top-k softmax's backward on the chosen
// columns (0 elsewhere), plus, when scores and counts are given, the load-balancing loss's gradient
// aux_scale s (count - s . counts) (moe_math::aux_loss_grad_scale gives aux_scale). counts (num_experts) int32 on the
// device: the micro-batch's tokens per expert, whole numbers (kernels/cpu holds them as exact floats).
void moe_router_backward(__nv_bfloat16* dlogits, const float* dprobs, const float* probs, const int* experts,
                         const float* scores, const int* counts, int tokens, int num_experts, int top_k,
                         float aux_scale, cudaStream_t stream);

// ---- Permutation -------------------------------------------------------------------------------------------------

// out (tokens * top_k, hidden): out[rows[t, j]] = inp[t]. OVERWRITES out.
void moe_permute_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const int* rows, int tokens, int hidden,
                         int top_k, cudaStream_t stream);
// dinp (tokens, hidden) = sum over j in slot order of dout[rows[t, j]] (fp32 sum, one rounding). OVERWRITES dinp.
void moe_permute_backward(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const int* rows, int tokens, int hidden,
                          int top_k, cudaStream_t stream);
// out (tokens, hidden) = sum over j in slot order of probs[t, j] inp[rows[t, j]]. OVERWRITES out.
void moe_unpermute_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const float* probs, const int* rows,
                           int tokens, int hidden, int top_k, cudaStream_t stream);
// dinp (tokens * top_k, hidden): dinp[rows[t, j]] = probs[t, j] dout[t];  dprobs (tokens, top_k) fp32 = dout[t] .
// inp[rows[t, j]] (one warp per (t, j), a fixed-order butterfly). Both OVERWRITTEN.
void moe_unpermute_backward(__nv_bfloat16* dinp, float* dprobs, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                            const float* probs, const int* rows, int tokens, int hidden, int top_k,
                            cudaStream_t stream);

// ---- After the all-to-all: regroup rows by local expert (one device copy per non-empty chunk) --------------------

// chunk_rows (chunks), order (chunks) on the host: out's chunk i = inp's chunk order[i]. OVERWRITES out.
void moe_sort_chunks_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const int* chunk_rows, const int* order,
                             int chunks, int hidden, cudaStream_t stream);
// Its inverse: dinp's chunk order[i] = dout's chunk i.
void moe_sort_chunks_backward(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const int* chunk_rows, const int* order,
                              int chunks, int hidden, cudaStream_t stream);

// ---- Experts: one cuBLASLt GEMM per group on its consecutive rows -------------------------------------------------

// out (rows, out_features) = each group's rows of inp (rows, in_features) @ weights[g]^T, weights (groups,
// out_features, in_features); rows_per_group (groups) on the host. OVERWRITES out's rows.
void moe_grouped_matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* weights,
                                const int* rows_per_group, int groups, int in_features, int out_features, Cublas& blas,
                                cudaStream_t stream);
// dinp (rows, in_features) = dout @ weights[g] per group, OVERWRITTEN (nullptr: not computed); dweights (groups,
// out_features, in_features) fp32 += dout^T @ inp per group, ACCUMULATED.
void moe_grouped_matmul_backward(__nv_bfloat16* dinp, float* dweights, const __nv_bfloat16* dout,
                                 const __nv_bfloat16* inp, const __nv_bfloat16* weights, const int* rows_per_group,
                                 int groups, int in_features, int out_features, Cublas& blas, cudaStream_t stream);

}  // namespace twin::kernels::cuda

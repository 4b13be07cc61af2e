// Causal multi-head self-attention on the device, twin of kernels/cpu/attention.hpp (no dropout), with an optional
// ALiBi bias (Press et al., arXiv:2108.12409, as BigScience's BLOOM ran it):
//   s[t, t2] = (q_t . k_t2) / sqrt(head_dim) + m_h (t2 - t) for t2 <= t,   out_t = sum_t2 softmax(s[t, :])[t2] v_t2
// m_h is local head h's slope (kernels::cpu::alibi_slopes of the model's GLOBAL head count, from the rank's first
// global head on: the slopes follow the global head index), 0 without ALiBi. BigScience adds m_h t2: the same
// probabilities (a softmax ignores a shift of its whole row), but m_h (t2 - t) keeps the biases <= 0 and the fp32
// scores and lse small. The bias is a constant, without gradient: the backward's formulas are unchanged, it
// recomputes P from the saved lse with the same bias.
// Layout as llm.c and the CPU twin: qkv (batch, seq, 3, heads, head_dim), out (batch, seq, heads, head_dim); the
// forward saves the log-sum-exp of each score row, lse (batch, heads, seq) fp32, and the backward recomputes the
// probabilities from it (FlashAttention's bookkeeping), so the saved state matches the CPU twin's.
//
// The path: per sequence b, batched over its heads, three cuBLASLt GEMMs read q, k, v in place (gemm_plan.hpp) and a
// fused causal softmax (one warp per row) sits between them:
//   forward   S = scale q k^T (fp32 scratch)  ->  S + bias, P = exp(S - lse), lse (bf16 P, masked)  ->  out = P v
//   backward  S again, dP = dout v^T (fp32)  ->  S + bias, dS = scale P (dP - rowsum(P dP)) (bf16)  ->  dv = P^T dout,
//             dq = dS k, dk = dS^T q
// Scratch per call: heads * seq^2 * 6 bytes (forward), 12 bytes (backward), stream-ordered (cudaMallocAsync).
//
// Grouped-query attention (Ainslie et al. 2023, GQA, arXiv:2305.13245; Llama 2 70B, Llama 3), the *_gqa functions:
// the `heads` query heads share kv_heads key/value heads, heads % kv_heads == 0, query head h taking k and v from kv
// head h / group, group = heads / kv_heads. Layout as the CPU twin's: qkv (batch, seq, (heads + 2*kv_heads)*head_dim),
// each token's row [q: heads*head_dim | k: kv_heads*head_dim | v: kv_heads*head_dim]; out and lse as above. The same
// path, with the GEMMs batched over the kv heads: the j-th query head of every group (h = g group + j, g the batch
// entry) is one call, j = 0 .. group-1 (GroupedAttentionShape below, run on the CPU by tests/kernels_cuda). The fused
// softmaxes are those of multi-head attention, over all heads * seq rows. dk and dv of a kv head are the sums over
// its group's query heads: fp32 scratch (kv_heads, seq, head_dim) each, accumulated by the GEMMs of j = 0, 1, ... in
// order (beta 0, then 1: deterministic), then rounded once into dqkv. Extra scratch per backward call:
// kv_heads * seq * head_dim * 8 bytes. With kv_heads == heads the *_gqa functions are attention_forward / backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/gemm_plan.hpp"

namespace twin::kernels::cuda {

class Cublas;

// out (batch, seq, heads*head_dim) bf16, lse (batch, heads, seq) fp32 <- qkv (batch, seq, 3*heads*head_dim) bf16
// alibi_slopes: a DEVICE pointer to the `heads` fp32 ALiBi slopes of the local heads, read by the kernels on `stream`;
// nullptr: no bias. Overwrites out and lse. out must not alias qkv.
void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int batch, int seq, int heads,
                       int head_dim, Cublas& blas, cudaStream_t stream, const float* alibi_slopes = nullptr);

// dqkv (batch, seq, 3*heads*head_dim) <- dout (batch, seq, heads*head_dim), qkv, lse (batch, heads, seq)
// alibi_slopes: the DEVICE slopes the forward was given (lse was computed with them), or nullptr.
// OVERWRITES dqkv (dq, dk and dv of every local head). dqkv must not alias dout or qkv.
void attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const float* lse,
                        int batch, int seq, int heads, int head_dim, Cublas& blas, cudaStream_t stream,
                        const float* alibi_slopes = nullptr);

// Grouped-query attention_forward: out (batch, seq, heads*head_dim) bf16, lse (batch, heads, seq) fp32 <- qkv (batch,
// seq, (heads + 2*kv_heads)*head_dim) bf16, query head h attending with kv head h / (heads / kv_heads). kv_heads >= 1
// and heads % kv_heads == 0; otherwise as attention_forward, which this calls when kv_heads == heads.
void attention_forward_gqa(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int batch, int seq, int heads,
                           int kv_heads, int head_dim, Cublas& blas, cudaStream_t stream,
                           const float* alibi_slopes = nullptr);

// Grouped-query attention_backward: dqkv (batch, seq, (heads + 2*kv_heads)*head_dim) <- dout (batch, seq,
// heads*head_dim), qkv, lse (batch, heads, seq). OVERWRITES dqkv as a whole: dq of every query head, and dk, dv of
// every kv head, each the sum over the query heads of its group (in the order of the heads: deterministic).
// attention_backward when kv_heads == heads. dqkv must not alias dout or qkv.
void attention_backward_gqa(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                            const float* lse, int batch, int seq, int heads, int kv_heads, int head_dim, Cublas& blas,
                            cudaStream_t stream, const float* alibi_slopes = nullptr);

// --- the GEMM plans of grouped-query attention (gemm_plan.hpp's conventions), one sequence b at a time ---------------
// qkv_b (T, (H + 2 KV) D): q of query head h is the col-major (D, T) matrix at offset h D with ld (H + 2 KV) D; k of kv
// head g at (H + g) D, v at (H + KV + g) D. Every plan is batched over the KV kv heads g and serves query head
// h = g G + j (G = H / KV) for one j: q, out, dout and the scores of those heads step by G D (G T^2 for the scores),
// k and v by D. Scores and probabilities are (H, T, T) as multi-head attention's; the dk and dv sums fp32 scratch
// (KV, T, D), kv head g at g T D, row stride D (col-major (D, T) with ld D). With KV == H (G = 1, j = 0) every plan is
// its plan_attention_* twin.
struct GroupedAttentionShape {
  int seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int group() const { return heads / kv_heads; }
  std::int64_t hidden() const { return static_cast<std::int64_t>(heads) * head_dim; }  // q and out row: H D
  std::int64_t qkv_row() const { return static_cast<std::int64_t>(heads + 2 * kv_heads) * head_dim; }
  std::int64_t k_offset() const { return hidden(); }                                                  // H D
  std::int64_t v_offset() const { return hidden() + static_cast<std::int64_t>(kv_heads) * head_dim; }  // (H + KV) D
  std::int64_t scores_per_head() const { return static_cast<std::int64_t>(seq) * seq; }
  std::int64_t kv_sum_per_head() const { return static_cast<std::int64_t>(seq) * head_dim; }  // T D of the scratch
  // query head j of group g, in q, out, dout and dq (per token: offset j D + g G D) and in the scores (j T^2 + g G T^2)
  std::int64_t head_offset(int j) const { return static_cast<std::int64_t>(j) * head_dim; }
  std::int64_t head_stride() const { return static_cast<std::int64_t>(group()) * head_dim; }
  std::int64_t scores_offset(int j) const { return j * scores_per_head(); }
  std::int64_t scores_stride() const { return group() * scores_per_head(); }
};

namespace detail {
inline GemmPlan kv_head_batched(const GroupedAttentionShape& s, int m, int n, int k) {
  GemmPlan p;
  p.m = m, p.n = n, p.k = k;
  p.batch = s.kv_heads;
  return p;
}
}  // namespace detail

// scores of heads g G + j (Tq, Tk) = scale * q k^T:  A = k (offset H D, stride D), B = q (offset j D, stride G D),
// D = scores (fp32 scratch, offset j T^2, stride G T^2)
inline GemmPlan plan_grouped_attention_scores(const GroupedAttentionShape& s, int j, float scale) {
  GemmPlan p = detail::kv_head_batched(s, s.seq, s.seq, s.head_dim);
  p.trans_a = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.k_offset();
  p.ldb = s.qkv_row(), p.stride_b = s.head_stride(), p.offset_b = s.head_offset(j);
  p.ldd = s.seq, p.stride_d = s.scores_stride(), p.offset_d = s.scores_offset(j);
  p.alpha = scale;
  return p;
}

// out_h (Tq, D) = P_h v_g:  A = v (offset (H + KV) D, stride D), B = probabilities (offset j T^2, stride G T^2),
// D = out (row stride H D, offset j D, stride G D)
inline GemmPlan plan_grouped_attention_output(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.v_offset();
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.hidden(), p.stride_d = s.head_stride(), p.offset_d = s.head_offset(j);
  return p;
}

// dP_h (Tq, Tk) = dout_h v_g^T:  A = v (transposed), B = dout (row stride H D, offset j D, stride G D), D = dP (fp32
// scratch, offset j T^2, stride G T^2)
inline GemmPlan plan_grouped_attention_dprobs(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.seq, s.seq, s.head_dim);
  p.trans_a = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.v_offset();
  p.ldb = s.hidden(), p.stride_b = s.head_stride(), p.offset_b = s.head_offset(j);
  p.ldd = s.seq, p.stride_d = s.scores_stride(), p.offset_d = s.scores_offset(j);
  return p;
}

// dq_h (Tq, D) = dS_h k_g:  A = k, B = dS (bf16 scratch, already times the softmax scale; offset j T^2, stride G T^2),
// D = dqkv (offset j D, stride G D): q's slot, overwritten
inline GemmPlan plan_grouped_attention_dquery(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.k_offset();
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.qkv_row(), p.stride_d = s.head_stride(), p.offset_d = s.head_offset(j);
  return p;
}

// dk_g (Tk, D) (+)= dS_h^T q_h:  A = q (offset j D, stride G D), B = dS (transposed), D = the fp32 dk sums
// (KV, T, D); beta 0 for j = 0 (overwritten), 1 after (the group's heads summed in order)
inline GemmPlan plan_grouped_attention_dkey(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.trans_b = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_stride(), p.offset_a = s.head_offset(j);
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.head_dim, p.stride_d = s.kv_sum_per_head();
  p.beta = j == 0 ? 0.0f : 1.0f;
  return p;
}

// dv_g (Tk, D) (+)= P_h^T dout_h:  A = dout (row stride H D, offset j D, stride G D), B = probabilities (transposed),
// D = the fp32 dv sums (KV, T, D); beta as plan_grouped_attention_dkey's
inline GemmPlan plan_grouped_attention_dvalue(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.trans_b = true;
  p.lda = s.hidden(), p.stride_a = s.head_stride(), p.offset_a = s.head_offset(j);
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.head_dim, p.stride_d = s.kv_sum_per_head();
  p.beta = j == 0 ? 0.0f : 1.0f;
  return p;
}

}  // namespace twin::kernels::cuda

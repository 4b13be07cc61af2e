// Causal multi-head self-attention over the rank's local heads (Megatron: heads/tp per rank), no dropout, with an
// optional ALiBi bias (Press et al., ICLR 2022, arXiv:2108.12409, as BigScience's BLOOM ran it):
//   for each batch b, head h, query position t (k and v: those of head h's kv head, below):
//     s[t2] = (q_t . k_t2) / sqrt(head_dim) + m_h (t2 - t)   for t2 <= t (causal mask: later keys never contribute)
//     out_t = sum_t2 softmax(s)[t2] v_t2
// m_h is head h's ALiBi slope (alibi_slopes below), 0 without ALiBi; the bias is added after the 1/sqrt(head_dim)
// scaling, before the softmax. BigScience adds m_h t2; a softmax does not change when its whole row is shifted by the
// same amount (here -m_h t), so m_h (t2 - t) gives the same probabilities while keeping every bias <= 0: the row's
// largest scores stay those near the query's own key instead of growing with t (m_h t reaches 1024 at slope 1/2 and
// seq 2048), which keeps the fp32 scores, their maximum and the saved lse small. The bias is a constant: it has no
// gradient, and the backward's formulas are unchanged (it recomputes p from the saved lse with the same bias).
// Grouped-query attention (Ainslie et al. 2023, GQA, arXiv:2305.13245; Llama 2 70B, Llama 3): the `heads` query heads
// share kv_heads key/value heads, heads % kv_heads == 0, query head h taking k and v from kv head h / (heads /
// kv_heads) (the *_gqa kernels; kv_heads == heads is multi-head attention, kv_heads == 1 multi-query attention).
// Layout: qkv (batch, seq, (heads + 2*kv_heads)*head_dim), each token's row [q: heads*head_dim | k: kv_heads*head_dim
// | v: kv_heads*head_dim]; with kv_heads == heads that is llm.c's (batch, seq, 3, heads, head_dim): all of q, then all
// of k, then all of v. (Megatron-Core's fused QKV GEMM orders its columns by group instead, [q of the group's heads |
// k | v] per kv head: a permutation of the weight's rows.) out (batch, seq, heads, head_dim). The forward saves only
// the log-sum-exp of each score row, lse (batch, heads, seq), and the backward recomputes the probabilities from it
// (FlashAttention's bookkeeping: B*H*T floats saved instead of B*H*T*T).
// Computed per (batch, head) with GEMMs (detail::gemm: cblas_sgemm, or the portable GEMM without BLAS) over blocks of
// query rows, each against the keys up to its last row only: the blocks above the diagonal are skipped, and inside a
// diagonal block the masked probabilities are exact zeros (qkv must be finite: 0 * inf would leak across the mask).
// Scratch is O(seq * (head_dim + block)) floats per call, never (seq, seq).
#pragma once

#include <vector>

namespace twin::kernels::cpu {

// The ALiBi slopes m_0 .. m_{n-1} of a model with n = total_heads heads (n > 0), indexed by the GLOBAL head index
// (BigScience Megatron-DeepSpeed's get_slopes, from Press's fairseq code):
//   n a power of two:  m_i = start^(i+1), start = 2^(-2^-(log2(n) - 3)) = 2^(-8/n)   i.e. 2^(-8/n), 2^(-16/n), ...,
//                      2^-8 (8 heads: 1/2, 1/4, ..., 1/256; one head: 2^-8)
//   otherwise:         with c = 2^floor(log2 n): the c slopes of c heads, then the even-indexed slopes (0, 2, 4, ...)
//                      of 2c heads, the first n - c of them (12 heads: 2^-1, ..., 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5,
//                      2^-3.5)
// Under tensor parallelism rank r holds heads [r n/tp, (r+1) n/tp) and passes the kernels
// alibi_slopes(n).data() + r n/tp: the slopes of its heads' global indices, not alibi_slopes(n/tp).
std::vector<float> alibi_slopes(int total_heads);

// out (batch, seq, heads*head_dim), lse (batch, heads, seq) <- qkv (batch, seq, 3*heads*head_dim)
// alibi_slopes: the ALiBi slopes of the `heads` local heads (finite), or nullptr for no bias (then the results are
// bit for bit those of a build without ALiBi). Overwrites out and lse. out must not alias qkv.
void attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int head_dim,
                       const float* alibi_slopes = nullptr);

// dqkv (batch, seq, 3*heads*head_dim) <- dout (batch, seq, heads*head_dim), qkv, lse (batch, heads, seq)
// alibi_slopes: those the forward was given (lse was computed with them). OVERWRITES dqkv (dq, dk and dv of every
// local head). dqkv must not alias dout or qkv.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                        int heads, int head_dim, const float* alibi_slopes = nullptr);

// Grouped-query attention_forward: out (batch, seq, heads*head_dim), lse (batch, heads, seq) <- qkv (batch, seq,
// (heads + 2*kv_heads)*head_dim), query head h attending with kv head h / (heads / kv_heads). kv_heads >= 1 and
// heads % kv_heads == 0; otherwise as attention_forward, which is this with kv_heads = heads (the same bits).
void attention_forward_gqa(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int kv_heads,
                           int head_dim, const float* alibi_slopes = nullptr);

// Grouped-query attention_backward: dqkv (batch, seq, (heads + 2*kv_heads)*head_dim) <- dout (batch, seq,
// heads*head_dim), qkv, lse (batch, heads, seq). OVERWRITES dqkv as a whole: dq of every query head, and dk, dv of
// every kv head, each the sum over the query heads of its group (in the order of the heads: deterministic).
// attention_backward is this with kv_heads = heads (the same bits).
void attention_backward_gqa(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                            int heads, int kv_heads, int head_dim, const float* alibi_slopes = nullptr);

}  // namespace twin::kernels::cpu

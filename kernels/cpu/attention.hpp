// Causal multi-head self-attention over the rank's local heads (Megatron: heads/tp per rank), no dropout:
//   for each batch b, head h, query position t:
//     s[t2] = (q_t . k_t2) / sqrt(head_dim)   for t2 <= t (causal mask: later keys never contribute)
//     out_t = sum_t2 softmax(s)[t2] v_t2
// Layout as llm.c: qkv (batch, seq, 3, heads, head_dim), i.e. each token's row of 3*heads*head_dim holds all of q,
// then all of k, then all of v; out (batch, seq, heads, head_dim). The forward saves only the log-sum-exp of each
// score row, lse (batch, heads, seq), and the backward recomputes the probabilities from it (FlashAttention's
// bookkeeping: B*H*T floats saved instead of B*H*T*T).
// Computed per (batch, head) with GEMMs (detail::gemm: cblas_sgemm, or the portable GEMM without BLAS) over blocks of
// query rows, each against the keys up to its last row only: the blocks above the diagonal are skipped, and inside a
// diagonal block the masked probabilities are exact zeros (qkv must be finite: 0 * inf would leak across the mask).
// Scratch is O(seq * (head_dim + block)) floats per call, never (seq, seq).
#pragma once

namespace twin::kernels::cpu {

// out (batch, seq, heads*head_dim), lse (batch, heads, seq) <- qkv (batch, seq, 3*heads*head_dim)
// Overwrites out and lse. out must not alias qkv.
void attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int head_dim);

// dqkv (batch, seq, 3*heads*head_dim) <- dout (batch, seq, heads*head_dim), qkv, lse (batch, heads, seq)
// OVERWRITES dqkv (dq, dk and dv of every local head). dqkv must not alias dout or qkv.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                        int heads, int head_dim);

}  // namespace twin::kernels::cpu

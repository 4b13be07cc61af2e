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
// entry) is one call, j = 0 .. group-1 (GroupedAttentionShape in gemm_plan.hpp, run on the CPU by
// tests/kernels_cuda). The fused softmaxes are those of multi-head attention, over all heads * seq rows. dk and dv of a kv head are the sums over
// its group's query heads: fp32 scratch (kv_heads, seq, head_dim) each, accumulated by the GEMMs of j = 0, 1, ... in
// order (beta 0, then 1: deterministic), then rounded once into dqkv. Extra scratch per backward call:
// kv_heads * seq * head_dim * 8 bytes. With kv_heads == heads the *_gqa functions are attention_forward / backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

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

}  // namespace twin::kernels::cuda

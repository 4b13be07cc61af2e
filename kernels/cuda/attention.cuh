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

}  // namespace twin::kernels::cuda

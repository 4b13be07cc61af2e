// Fused causal attention on the device (FlashAttention-2: Dao, arXiv:2307.08691), twin's own kernels, mirrored tile
// for tile by kernels/cpu/flash_attention.hpp (the same tiles, loop order, online softmax and masking: the tests on
// every CI run check that logic on the CPU, the device tests check these kernels against it).
//
// Computes what attention.cuh computes (causal, grouped-query, optional ALiBi; the same layouts and the same saved
// lse), without the (heads, seq, seq) score matrices: a block of 4 warps takes a tile of 64 queries (16 per warp),
// keeps it in shared memory with a tile of 64 keys and values at a time, and keeps each row's running maximum, sum and
// output in registers. Products run on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulation; operands loaded
// with ldmatrix from shared memory rows padded by 8 bf16); the probabilities are rounded to bf16 for the P V product,
// as FlashAttention-2 does.
//   forward   per (query tile, sequence and query head): for each key tile the tile can see, S = scale Q K^T (+ ALiBi),
//             masked by position, online softmax, O += P V; then out = O / l and lse = m + log l
//   backward  delta = rowsum(dout * out) (one warp per row), then two kernels that each write their gradient once
//             (no atomics: deterministic):
//             dk/dv  per (key tile, sequence and kv head): the group's query heads in order, query steps of
//                    launch::flash_backward_query_tile(head_dim) rows: P^T = e^(S^T - lse), dV += P^T dout,
//                    dP^T = V dout^T, dS^T = P^T (dP^T - delta), dK += scale dS^T Q
//             dq     per (query tile, sequence and query head): for each key tile, P, dP, dS again, dQ += scale dS K
// head_dim 32, 64, 96 or 128 (flash_supports_head_dim); other sizes take attention.cuh's unfused path. Shared memory
// per block: launch::flash_shape (52 KB for head_dim 128 in the forward, 68 KB in the dq kernel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

// true for the head sizes the fused kernels are built for
bool flash_attention_supports(int head_dim);

// out (batch, seq, heads*head_dim) bf16, lse (batch, heads, seq) fp32 <- qkv (batch, seq, (heads + 2*kv_heads)
// *head_dim) bf16, query head h reading kv head h / (heads / kv_heads). alibi_slopes: DEVICE pointer to the `heads`
// fp32 slopes, or nullptr. Overwrites out and lse; out must not alias qkv.
void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int batch, int seq, int heads,
                             int kv_heads, int head_dim, cudaStream_t stream, const float* alibi_slopes = nullptr);

// dqkv (batch, seq, (heads + 2*kv_heads)*head_dim) bf16, OVERWRITTEN as a whole <- dout (batch, seq, heads*head_dim),
// qkv, and the forward's out and lse (and slopes). Scratch: batch * heads * seq floats (delta), stream-ordered.
// dqkv must not alias the inputs.
void flash_attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                              const __nv_bfloat16* out, const float* lse, int batch, int seq, int heads, int kv_heads,
                              int head_dim, cudaStream_t stream, const float* alibi_slopes = nullptr);

}  // namespace twin::kernels::cuda

// Rotary position embedding (Su et al. 2021, RoFormer, arXiv:2104.09864) on the device, twin of kernels/cpu/rope.hpp:
// Megatron-Core's default non-interleaved form (rotate_half). Each head vector x of q and k, head_dim d even, is split
// into halves x1 = x[0, d/2), x2 = x[d/2, d), and pair i of them is rotated by the angle pos * theta_i:
//   theta_i = base^(-2i/d),   angle = pos * theta_i,   i in [0, d/2)
//   out1_i = x1_i cos(angle) - x2_i sin(angle)
//   out2_i = x2_i cos(angle) + x1_i sin(angle)
// With rotary_dim r < d only x[0, r) is rotated, as a vector of dimension r (theta_i = base^(-2i/r)); x[r, d) passes
// through (partial rotary embeddings, as the CPU twin).
// pos is the token's position within its sequence, 0 .. seq-1. The angles in double, each cos / sin rounded once to
// fp32, and the rotation in the CPU twin's fp32 operations (math.hpp): the CPU twin's fp32 results, rounded to bf16.
// Layout: qkv (batch, seq, (heads + 2*kv_heads)*head_dim) bf16, each token's row
// [q: heads*head_dim | k: kv_heads*head_dim | v: kv_heads*head_dim]; q and k are rotated in place, v is never read or
// written. One thread per rotated pair (grid-stride loop).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

// qkv (batch, seq, (heads + 2*kv_heads)*head_dim): rotates each q and k head vector in place, by its token's position.
// rotary_dim: the leading dimensions rotated, even and at most head_dim; 0: all head_dim (then even). base > 0, finite.
void rope_forward(__nv_bfloat16* qkv, int batch, int seq, int heads, int kv_heads, int head_dim, cudaStream_t stream,
                  float base = 10000.f, int rotary_dim = 0);

// Backward of rope_forward, in place on dqkv (same layout): the rotation by -angle (the same cos, the sign of sin
// flipped), applied to dq and dk; dv is left as it is.
void rope_backward(__nv_bfloat16* dqkv, int batch, int seq, int heads, int kv_heads, int head_dim, cudaStream_t stream,
                   float base = 10000.f, int rotary_dim = 0);

}  // namespace twin::kernels::cuda

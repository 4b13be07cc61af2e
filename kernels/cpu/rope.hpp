// Rotary position embedding (Su et al. 2021, RoFormer, arXiv:2104.09864) in Megatron-Core's default non-interleaved
// form (rotate_half, as GPT-NeoX and Llama's Hugging Face port): each head vector x of q and k, head_dim d even, is
// split into halves x1 = x[0, d/2), x2 = x[d/2, d), and pair i of them is rotated by the angle pos * theta_i:
//   theta_i = base^(-2i/d),   angle = pos * theta_i,   i in [0, d/2)
//   out1_i = x1_i cos(angle) - x2_i sin(angle)
//   out2_i = x2_i cos(angle) + x1_i sin(angle)
// Partial rotary embeddings (GPT-NeoX's rotary_pct, Megatron-Core's --rotary-percent): with rotary_dim r < d only
// x[0, r) is rotated, as a vector of dimension r (halves [0, r/2) and [r/2, r), theta_i = base^(-2i/r)); x[r, d)
// passes through.
// pos is the token's position within its sequence, 0 .. seq-1 (position 0 is the identity). q_t . k_t2 then depends on
// the positions only through t - t2. The angles are computed in double and each cos / sin rounded once to fp32, so a
// position's rotation does not depend on seq, batch or head (Megatron-Core computes theta and the angle in fp32: at
// large positions its angles differ from these by that rounding).
// Layout: the attention's qkv (batch, seq, (heads + 2*kv_heads)*head_dim), each token's row
// [q: heads*head_dim | k: kv_heads*head_dim | v: kv_heads*head_dim] (attention.hpp); q and k are rotated in place,
// v is never read or written.
#pragma once

namespace twin::kernels::cpu {

// qkv (batch, seq, (heads + 2*kv_heads)*head_dim): rotates each q and k head vector in place, by its token's position.
// rotary_dim: the leading dimensions rotated, even and at most head_dim; 0: all head_dim (then even). base > 0, finite.
// first_position: the position of the first token (a context-parallel rank's chunk starts inside its sequence).
void rope_forward(float* qkv, int batch, int seq, int heads, int kv_heads, int head_dim, float base = 10000.f,
                  int rotary_dim = 0, int first_position = 0);

// Backward of rope_forward, in place on dqkv (same layout): a rotation's transpose is the rotation by -angle,
//   din1_i = dout1_i cos(angle) + dout2_i sin(angle),   din2_i = dout2_i cos(angle) - dout1_i sin(angle)
// applied to dq and dk (exactly the transpose of the forward's fp32 rotation: the same cos, sin with the sign of sin
// flipped); dv is left as it is.
void rope_backward(float* dqkv, int batch, int seq, int heads, int kv_heads, int head_dim, float base = 10000.f,
                   int rotary_dim = 0, int first_position = 0);

}  // namespace twin::kernels::cpu

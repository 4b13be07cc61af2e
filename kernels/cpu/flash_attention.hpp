// Fused causal attention in tiles (FlashAttention-2: Dao, arXiv:2307.08691, Algorithms 1 and 2), the fp32 CPU mirror
// of kernels/cuda/flash_attention.cu: the same tiles, the same loop order, the same online softmax and masking, so
// that the tile logic the GPU runs is checked here on every run against the plain attention (attention.hpp).
//
// What it computes is attention.hpp's, with an optional ALiBi bias, on queries and keys at ABSOLUTE positions:
//   s[i, j] = (q_i . k_j) / sqrt(head_dim) + m_h (pos_j - pos_i)        for pos_j <= pos_i (causal, by position)
//   out_i = sum_j softmax(s[i, :])[j] v_j,     lse_i = log sum_j exp(s[i, j])     (natural log, as attention.hpp)
// with query head h reading kv head h / (heads / kv_heads) (grouped-query attention; kv_heads == heads: multi-head).
//
// The tile loops (Br = kFlashQueryTile, Bc = kFlashKeyTile):
//   forward   per (sequence, query head, query tile of Br rows): running max m, sum l and output o of each row;
//             for each key tile of Bc keys that a row of the tile can see: S = scale Q K^T (+ bias), masked;
//             m' = max(m, rowmax S), l = e^(m - m') l + rowsum e^(S - m'), o = e^(m - m') o + e^(S - m') V; then
//             out = o / l, lse = m + log l. Key tiles wholly after the tile's last query are never visited.
//   backward  delta_i = dout_i . out_i (flash_attention_delta), then two passes that each write their gradient once,
//             with no atomics (deterministic, where FlashAttention-2 adds dq atomically):
//             dk/dv  per (sequence, kv head, key tile of Bc keys): for each query head of the group and each query
//                    tile of flash_backward_query_tile(head_dim) rows that can see the key tile:
//                    P = e^(S - lse), dv += P^T dout, dP = dout V^T, dS = P (dP - delta), dk += scale dS^T Q
//             dq     per (sequence, query head, query tile of Br rows): for each key tile it sees: P, dP, dS again,
//                    dq += scale dS K
//             (the dq pass recomputes S and dP: 7 tile products where one pass with atomics needs 5).
// A row that sees no key of a block (possible between blocks of different offsets) has out 0 and lse -inf, and
// adds nothing to any gradient.
//
// The block functions below are what ring attention (context parallelism) needs: attention of a block of queries
// against a block of keys/values at given absolute offsets, partial results merged by their lse, and the backward of
// one block pair given the global lse and delta. flash_attention_forward / backward run them on a whole sequence in
// the packed qkv layout of attention.hpp.
#pragma once

#include <cstddef>

namespace twin::kernels::cpu {

// Tile sizes, the CUDA kernels' (one thread block of 4 warps, 16 query or key rows per warp, takes one tile).
inline constexpr int kFlashQueryTile = 64;  // Br: query rows of a forward and a dq tile
inline constexpr int kFlashKeyTile = 64;    // Bc: keys of a tile, in every pass
// query rows per step of the dk/dv pass: 32 above head_dim 64, where a warp's dk and dv accumulators (2 x 16 x D
// fp32) leave fewer registers for the score tiles
constexpr int flash_backward_query_tile(int head_dim) {
  return head_dim <= 64 ? 64 : 32;
}

// Where one operand's rows live: element d of head h of token t of sequence b is
//   data[b * batch_stride + t * token_stride + h * head_dim + d]
// e.g. q in a packed qkv (batch, seq, (H + 2 KV) D): data = qkv, token_stride = (H + 2 KV) D, batch_stride = seq *
// token_stride; k: data = qkv + H D; v: data = qkv + (H + KV) D; out (batch, seq, H, D): token_stride = H D.
template <class T>
struct HeadRows {
  T* data = nullptr;
  std::size_t batch_stride = 0;  // elements between sequences
  std::size_t token_stride = 0;  // elements between consecutive tokens
};

// One block pair: `q_len` queries at absolute positions [q_start, q_start + q_len) against `kv_len` keys and values
// at [kv_start, kv_start + kv_len), of `batch` sequences. Key j is visible to query i when kv_start + j <= q_start + i.
struct FlashBlock {
  int batch = 1, heads = 1, kv_heads = 1, head_dim = 1;
  int q_start = 0, q_len = 0;
  int kv_start = 0, kv_len = 0;
  const float* alibi_slopes = nullptr;  // (heads): the ALiBi slope of each query head, or nullptr for no bias
};

// out (batch, q_len, heads, head_dim), lse (batch, heads, q_len) <- q (batch, q_len, heads, head_dim),
// k, v (batch, kv_len, kv_heads, head_dim): the block's partial attention (OVERWRITTEN). Rows that see no key get
// out 0, lse -inf.
void flash_attention_block_forward(HeadRows<float> out, float* lse, HeadRows<const float> q, HeadRows<const float> k,
                                   HeadRows<const float> v, const FlashBlock& block);

// The attention over the union of two key sets from its two partials: lse = log(e^lse + e^lse_b),
// out = e^(lse_old - lse) out + e^(lse_b - lse) out_b, IN PLACE on (out, lse). out, out_b (batch, len, heads,
// head_dim), lse, lse_b (batch, heads, len). A partial with lse -inf (no key seen) contributes nothing.
void flash_attention_merge(HeadRows<float> out, float* lse, HeadRows<const float> out_b, const float* lse_b, int batch,
                           int len, int heads, int head_dim);

// delta (batch, heads, len) = rowsum(dout * out) <- dout, out (batch, len, heads, head_dim): the backward's
// D_i = dout_i . out_i (sum_j P_ij dP_ij), with out the FINAL (merged) output.
void flash_attention_delta(float* delta, HeadRows<const float> dout, HeadRows<const float> out, int batch, int len,
                           int heads, int head_dim);

// The backward of one block pair, ACCUMULATED (+=) into dq (batch, q_len, heads, head_dim) and dk, dv (batch, kv_len,
// kv_heads, head_dim), given dout (batch, q_len, heads, head_dim), q, k, v as in the forward, and the GLOBAL lse and
// delta (batch, heads, q_len) of the queries (over every key block, not this block's partial lse). dk and dv of a kv
// head sum its group's query heads in order; summed over every block pair, the gradients are attention's.
void flash_attention_block_backward(HeadRows<float> dq, HeadRows<float> dk, HeadRows<float> dv,
                                    HeadRows<const float> dout, HeadRows<const float> q, HeadRows<const float> k,
                                    HeadRows<const float> v, const float* lse, const float* delta,
                                    const FlashBlock& block);

// Whole sequences in attention.hpp's packed layout (its attention_forward_gqa's arguments):
// out (batch, seq, heads*head_dim), lse (batch, heads, seq) <- qkv (batch, seq, (heads + 2*kv_heads)*head_dim).
void flash_attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int kv_heads,
                             int head_dim, const float* alibi_slopes = nullptr);

// dqkv (batch, seq, (heads + 2*kv_heads)*head_dim), OVERWRITTEN <- dout (batch, seq, heads*head_dim), qkv, out and
// lse of the forward. dqkv must not alias the inputs.
void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int batch, int seq, int heads, int kv_heads, int head_dim,
                              const float* alibi_slopes = nullptr);

}  // namespace twin::kernels::cpu

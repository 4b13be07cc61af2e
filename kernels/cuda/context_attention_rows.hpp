// Context-parallel attention, one query row (or one key row) at a time: the work of one device thread of
// context_parallel.cu's kernels, written once for both sides. The kernels instantiate it on bf16 tensors; the host
// test (tests/kernels_cuda/context_host_test.cpp) runs the same functions on fp32 over every row and compares them with
// kernels/cpu/ring_attention.hpp. Plain loops in fp32, no tiles: correct first, speed is flash_attention.cu's business.
//
// The math (s = scale q.k, scale = 1 / sqrt(D), causal by position in the WHOLE sequence: key at position p_j is seen
// by the query at p_i when p_j <= p_i; query head h reads kv head h / (H / KV)):
//   forward   online softmax over the visible keys of the given rank blocks: m' = max(m, s), l = e^(m - m') l + e^(s
//             - m'), o = e^(m - m') o + e^(s - m') v; partial out = o / l, lse = m + log l (-inf, out 0: no key);
//             merged into (out, lse) by context::merge_lse, or written as it is (the first ring step, all_gather)
//   delta     delta_i = dout_i . out_i (out the final, merged output)
//   backward  with the FINAL lse and delta of each query: p = e^(s - lse_i), dp = dout_i . v_j, ds = p (dp - delta_i)
//             dq_i += scale sum_j ds k_j     (a query row: every visible key of the blocks)
//             dk_j += scale sum_(h, i) ds q_i, dv_j += sum_(h, i) p dout_i   (a key row: the group's query heads and
//             every local query that sees it)
//   rope      a q or k pair rotated as rope.cuh rotates it, at its token's position in the whole sequence
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

#include "kernels/cuda/context_math.hpp"

namespace twin::kernels::cuda::context {

// Head vectors of at most this many elements (a thread keeps a few in fp32).
inline constexpr int kMaxHeadDim = 256;

TWIN_HOST_DEVICE inline float to_f32(float x) {
  return x;
}
TWIN_HOST_DEVICE inline float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
TWIN_HOST_DEVICE inline T from_f32(float x);
template <>
TWIN_HOST_DEVICE inline float from_f32<float>(float x) {
  return x;
}
template <>
TWIN_HOST_DEVICE inline __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Keys and values of some CP ranks' tokens: element d of kv head g of local token l of sequence b of the block of rank
// first_rank + k is at keys[k rank_stride + (b L + l) token_stride + g D + d] (values alike). all_gather: every rank's
// (cp, B, L, KV D) blocks (first_rank 0, ranks cp); the ring: one rank's (B, L, 2 KV D) block (ranks 1).
template <class T>
struct KeyBlocks {
  T* keys = nullptr;
  T* values = nullptr;
  std::size_t token_stride = 0, rank_stride = 0;
  int first_rank = 0, ranks = 1;
  TWIN_HOST_DEVICE std::size_t at(int k, int b, int local, int g, const Layout& s) const {
    return static_cast<std::size_t>(k) * rank_stride +
           (static_cast<std::size_t>(b) * s.local_len() + local) * token_stride +
           static_cast<std::size_t>(g) * s.head_dim;
  }
};

template <class T>
TWIN_HOST_DEVICE inline float dot(const T* a, const float* b, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += to_f32(a[d]) * b[d];
  return sum;
}

// Query row `row` = (b H + h) L + i of rank `rank` against the visible keys of `kv`: out (B, L, H D) and lse
// (2, B, H, C), merged into (merge) or OVERWRITTEN (!merge).
template <class T>
TWIN_HOST_DEVICE void forward_row(std::size_t row, T* out, float* lse, const T* qkv, KeyBlocks<const T> kv, int rank,
                                  bool merge, const Layout& s) {
  const int len = s.local_len(), D = s.head_dim, i = static_cast<int>(row % len);
  const int h = static_cast<int>((row / len) % s.heads), b = static_cast<int>(row / len / s.heads);
  const int g = h / (s.heads / s.kv_heads), position = position_of(i, rank, s.seq, s.cp);
  const float scale = 1.0f / math::sqrt_rn(static_cast<float>(D));
  float q[kMaxHeadDim], o[kMaxHeadDim];
  const T* q_row = qkv + (static_cast<std::size_t>(b) * len + i) * s.qkv_width() + static_cast<std::size_t>(h) * D;
  for (int d = 0; d < D; ++d) q[d] = to_f32(q_row[d]), o[d] = 0.0f;
  float m = kMinusInf, l = 0.0f;
  for (int k = 0; k < kv.ranks; ++k) {
    for (int j = 0; j < len; ++j) {
      if (position_of(j, kv.first_rank + k, s.seq, s.cp) > position) continue;
      const std::size_t at = kv.at(k, b, j, g, s);
      const float score = scale * dot(kv.keys + at, q, D), m_new = max_f(m, score);
      const float alpha = exp_f(m - m_new), p = exp_f(score - m_new);
      l = alpha * l + p;
      for (int d = 0; d < D; ++d) o[d] = alpha * o[d] + p * to_f32(kv.values[at + d]);
      m = m_new;
    }
  }
  const float partial_lse = l > 0.0f ? m + log_f(l) : kMinusInf, inverse = l > 0.0f ? 1.0f / l : 0.0f;
  T* out_row = out + (static_cast<std::size_t>(b) * len + i) * s.out_width() + static_cast<std::size_t>(h) * D;
  const std::size_t stat = stat_index(b, h, i, s);
  const Merge w = merge ? merge_lse(lse[stat], partial_lse) : Merge{partial_lse, 0.0f, 1.0f};
  for (int d = 0; d < D; ++d) {
    const float old = merge && w.weight_a != 0.0f ? to_f32(out_row[d]) : 0.0f;
    out_row[d] = from_f32<T>(w.weight_a * old + w.weight_b * (o[d] * inverse));
  }
  lse[stat] = w.lse;
}

// delta (2, B, H, C) of query row `row` = (b H + h) L + i: dout_i . out_i, both (B, L, H D).
template <class T>
TWIN_HOST_DEVICE void delta_row(std::size_t row, float* delta, const T* dout, const T* out, const Layout& s) {
  const int len = s.local_len(), D = s.head_dim, i = static_cast<int>(row % len);
  const int h = static_cast<int>((row / len) % s.heads), b = static_cast<int>(row / len / s.heads);
  const std::size_t at = (static_cast<std::size_t>(b) * len + i) * s.out_width() + static_cast<std::size_t>(h) * D;
  float sum = 0.0f;
  for (int d = 0; d < D; ++d) sum += to_f32(dout[at + d]) * to_f32(out[at + d]);
  delta[stat_index(b, h, i, s)] = sum;
}

// The gradients' common inputs: this rank's queries, output gradient, final lse and delta.
template <class T>
struct Backward {
  const T* dout = nullptr;  // (B, L, H D)
  const T* qkv = nullptr;   // (B, L, (H + 2 KV) D)
  const float* lse = nullptr;
  const float* delta = nullptr;  // (2, B, H, C)
  int rank = 0;
};

// dq of query row `row` = (b H + h) L + i, ACCUMULATED: dq[(b L + i) dq_stride + h D + d] += scale sum_j ds k_j.
template <class T>
TWIN_HOST_DEVICE void dq_row(std::size_t row, T* dq, std::size_t dq_stride, const Backward<T>& x, KeyBlocks<const T> kv,
                             const Layout& s) {
  const int len = s.local_len(), D = s.head_dim, i = static_cast<int>(row % len);
  const int h = static_cast<int>((row / len) % s.heads), b = static_cast<int>(row / len / s.heads);
  const int g = h / (s.heads / s.kv_heads), position = position_of(i, x.rank, s.seq, s.cp);
  const float scale = 1.0f / math::sqrt_rn(static_cast<float>(D));
  const std::size_t token = static_cast<std::size_t>(b) * len + i, stat = stat_index(b, h, i, s);
  float q[kMaxHeadDim], dy[kMaxHeadDim], acc[kMaxHeadDim];
  for (int d = 0; d < D; ++d) {
    q[d] = to_f32(x.qkv[token * s.qkv_width() + static_cast<std::size_t>(h) * D + d]);
    dy[d] = to_f32(x.dout[token * s.out_width() + static_cast<std::size_t>(h) * D + d]);
    acc[d] = 0.0f;
  }
  for (int k = 0; k < kv.ranks; ++k) {
    for (int j = 0; j < len; ++j) {
      if (position_of(j, kv.first_rank + k, s.seq, s.cp) > position) continue;
      const std::size_t at = kv.at(k, b, j, g, s);
      const float p = exp_f(scale * dot(kv.keys + at, q, D) - x.lse[stat]);
      const float ds = p * (dot(kv.values + at, dy, D) - x.delta[stat]);
      for (int d = 0; d < D; ++d) acc[d] += ds * to_f32(kv.keys[at + d]);
    }
  }
  T* dq_row_at = dq + token * dq_stride + static_cast<std::size_t>(h) * D;
  for (int d = 0; d < D; ++d) dq_row_at[d] = from_f32<T>(to_f32(dq_row_at[d]) + scale * acc[d]);
}

// dk, dv of key row `row` = ((k B + b) KV + g) L + j of the blocks (dkv laid out as kv), ACCUMULATED (accumulate) or
// OVERWRITTEN: the group's query heads in order, each of this rank's local queries that sees the key.
template <class T>
TWIN_HOST_DEVICE void dkv_row(std::size_t row, KeyBlocks<T> dkv, const Backward<T>& x, KeyBlocks<const T> kv,
                              bool accumulate, const Layout& s) {
  const int len = s.local_len(), D = s.head_dim, j = static_cast<int>(row % len);
  const int g = static_cast<int>((row / len) % s.kv_heads), b = static_cast<int>((row / len / s.kv_heads) % s.batch);
  const int k = static_cast<int>(row / len / s.kv_heads / s.batch), group = s.heads / s.kv_heads;
  const int position = position_of(j, kv.first_rank + k, s.seq, s.cp);
  const float scale = 1.0f / math::sqrt_rn(static_cast<float>(D));
  const std::size_t at = kv.at(k, b, j, g, s);
  float key[kMaxHeadDim], value[kMaxHeadDim], dk[kMaxHeadDim], dv[kMaxHeadDim];
  for (int d = 0; d < D; ++d) {
    key[d] = to_f32(kv.keys[at + d]), value[d] = to_f32(kv.values[at + d]);
    dk[d] = 0.0f, dv[d] = 0.0f;
  }
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int i = 0; i < len; ++i) {
      if (position_of(i, x.rank, s.seq, s.cp) < position) continue;
      const std::size_t token = static_cast<std::size_t>(b) * len + i, stat = stat_index(b, h, i, s);
      const T* q = x.qkv + token * s.qkv_width() + static_cast<std::size_t>(h) * D;
      const T* dy = x.dout + token * s.out_width() + static_cast<std::size_t>(h) * D;
      const float p = exp_f(scale * dot(q, key, D) - x.lse[stat]);
      const float ds = p * (dot(dy, value, D) - x.delta[stat]);
      for (int d = 0; d < D; ++d) {
        dk[d] += ds * to_f32(q[d]);
        dv[d] += p * to_f32(dy[d]);
      }
    }
  }
  const std::size_t to = dkv.at(k, b, j, g, s);
  for (int d = 0; d < D; ++d) {
    const float dk_old = accumulate ? to_f32(dkv.keys[to + d]) : 0.0f;
    const float dv_old = accumulate ? to_f32(dkv.values[to + d]) : 0.0f;
    dkv.keys[to + d] = from_f32<T>(dk_old + scale * dk[d]);
    dkv.values[to + d] = from_f32<T>(dv_old + dv[d]);
  }
}

// Rotary embeddings by position in the whole sequence: pair e = (token (B L) (H + KV) + head) half + i, half =
// rotary_dim / 2, of qkv (B, L, (H + 2 KV) D), rotated by the angle of pair i at the token's position
// (math::rope_cos_sin, math::rope_rotate: rope.cuh's formulas); direction +1 forward, -1 backward.
template <class T>
TWIN_HOST_DEVICE void rope_pair(std::size_t e, T* qkv, int rank, int rotary_dim, float base, double direction,
                                const Layout& s) {
  const std::size_t half = static_cast<std::size_t>(rotary_dim / 2),
                    heads = static_cast<std::size_t>(s.heads + s.kv_heads);
  const int i = static_cast<int>(e % half), h = static_cast<int>((e / half) % heads);
  const std::size_t token = e / half / heads;
  const int t = position_of(static_cast<int>(token % static_cast<std::size_t>(s.local_len())), rank, s.seq, s.cp);
  float cos_angle = 0.0f, sin_angle = 0.0f;
  math::rope_cos_sin(t, i, rotary_dim, base, direction, &cos_angle, &sin_angle);
  T* x1 = qkv + token * s.qkv_width() + static_cast<std::size_t>(h) * s.head_dim + i;
  T* x2 = x1 + half;
  float a = to_f32(*x1), b = to_f32(*x2);
  math::rope_rotate(a, b, cos_angle, sin_angle);
  *x1 = from_f32<T>(a);
  *x2 = from_f32<T>(b);
}
TWIN_HOST_DEVICE inline std::size_t rope_pairs(int rotary_dim, const Layout& s) {
  return s.tokens() * static_cast<std::size_t>(s.heads + s.kv_heads) * static_cast<std::size_t>(rotary_dim / 2);
}

// Rows of each function: forward_row, delta_row, dq_row: B H L; dkv_row: ranks B KV L.
TWIN_HOST_DEVICE inline std::size_t query_rows(const Layout& s) {
  return static_cast<std::size_t>(s.batch) * s.heads * s.local_len();
}
TWIN_HOST_DEVICE inline std::size_t key_rows(int ranks, const Layout& s) {
  return static_cast<std::size_t>(ranks) * s.batch * s.kv_heads * s.local_len();
}

}  // namespace twin::kernels::cuda::context

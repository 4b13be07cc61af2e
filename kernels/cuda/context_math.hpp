// Context parallelism's index arithmetic and scalar formulas, shared by the CUDA kernels (context_parallel.cu) and the
// host (plain C++ when g++ compiles it): where a rank's local token sits in the whole sequence, which rank holds a
// position, where an lse or delta lives, the log-sum-exp merge of two partial attentions, and the column and
// Ulysses reshuffles as index maps. tests/kernels_cuda/context_host_test.cpp checks them on the CPU against
// kernels/cpu/ring_attention.hpp.
//
// The sequence split (model::cp_sequence_chunk, Megatron-Core's get_batch_on_this_cp_rank): 2 cp chunks of
// C = seq / (2 cp) tokens; rank r holds chunk r, then chunk 2 cp - 1 - r, as its L = seq / cp local tokens:
//   position(i, r) = chunk(r, i / C) C + i mod C,     chunk(r, 0) = r,  chunk(r, 1) = 2 cp - 1 - r
// lse and delta of a rank's queries: (2, B, H, C), one (B, H, C) block per local chunk (kernels/cpu's layout).
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/cuda/math.hpp"  // TWIN_HOST_DEVICE

namespace twin::kernels::cuda::context {

// One rank's view of context-parallel attention. H, KV: its query and key/value heads; D: head_dim.
struct Layout {
  int batch = 1, seq = 0, heads = 1, kv_heads = 1, head_dim = 1;
  int cp = 1;
  TWIN_HOST_DEVICE int local_len() const { return seq / cp; }        // L
  TWIN_HOST_DEVICE int chunk_len() const { return seq / (2 * cp); }  // C
  TWIN_HOST_DEVICE std::size_t qkv_width() const {                   // (H + 2 KV) D
    return static_cast<std::size_t>(heads + 2 * kv_heads) * head_dim;
  }
  TWIN_HOST_DEVICE std::size_t kv_width() const { return static_cast<std::size_t>(kv_heads) * head_dim; }  // KV D
  TWIN_HOST_DEVICE std::size_t out_width() const { return static_cast<std::size_t>(heads) * head_dim; }    // H D
  TWIN_HOST_DEVICE std::size_t tokens() const { return static_cast<std::size_t>(batch) * local_len(); }    // B L
};

// --- the 2 cp chunk layout
// ---------------------------------------------------------------------------------------------
TWIN_HOST_DEVICE inline int chunk_of(int rank, int part, int cp) {
  return part == 0 ? rank : 2 * cp - 1 - rank;
}

// The position in the whole sequence of local token `local` (0 .. L - 1) of rank `rank`.
TWIN_HOST_DEVICE inline int position_of(int local, int rank, int seq, int cp) {
  const int chunk = seq / (2 * cp);
  return chunk_of(rank, local / chunk, cp) * chunk + local % chunk;
}

// The rank that holds position `position`, and its local token there (the inverse of position_of).
struct Holder {
  int rank = 0, local = 0;
};
TWIN_HOST_DEVICE inline Holder holder_of(int position, int seq, int cp) {
  const int chunk_len = seq / (2 * cp), chunk = position / chunk_len;
  const int part = chunk < cp ? 0 : 1;
  return {part == 0 ? chunk : 2 * cp - 1 - chunk, part * chunk_len + position % chunk_len};
}

// Where the lse (or delta) of query head h of local token `local` of sequence b lives in (2, B, H, C).
TWIN_HOST_DEVICE inline std::size_t stat_index(int b, int h, int local, const Layout& s) {
  const int chunk = s.chunk_len(), part = local / chunk;
  return ((static_cast<std::size_t>(part) * s.batch + b) * s.heads + h) * chunk + local % chunk;
}

// --- fp32 functions, the same names on both sides ------------------------------------------------------------------
TWIN_HOST_DEVICE inline float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}
TWIN_HOST_DEVICE inline float log_f(float x) {
#if defined(__CUDA_ARCH__)
  return ::logf(x);
#else
  return std::log(x);
#endif
}
TWIN_HOST_DEVICE inline float max_f(float a, float b) {
  return a > b ? a : b;
}
inline constexpr float kMinusInf = -INFINITY;

// --- the log-sum-exp merge of two partial attentions of one query row (kernels/cpu/flash_attention_merge) ----------
// Two partials over disjoint key sets, (out_a, lse_a) and (out_b, lse_b), give the attention over their union:
//   lse = m + log(e^(lse_a - m) + e^(lse_b - m)),  m = max(lse_a, lse_b)
//   out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b
// A partial that saw no key has lse -inf and weight 0; when neither saw one, lse stays -inf and both weights are 0.
struct Merge {
  float lse = kMinusInf, weight_a = 0, weight_b = 0;
};
TWIN_HOST_DEVICE inline Merge merge_lse(float lse_a, float lse_b) {
  const float high = max_f(lse_a, lse_b);
  if (high == kMinusInf) return Merge{};
  Merge m;
  m.lse = high + log_f(exp_f(lse_a - high) + exp_f(lse_b - high));
  m.weight_a = exp_f(lse_a - m.lse);
  m.weight_b = exp_f(lse_b - m.lse);
  return m;
}

// --- index maps of the pure copies: element e of the compact side -> its element on the strided side ---------------
// A column range [column, column + range) of rows of `width`: compact (rows, range) <-> strided (rows, width).
// (The keys, values or K/V block of a packed qkv row; a gradient put back into its part of dqkv.)
struct ColumnRange {
  std::size_t width = 0, column = 0, range = 0;
  TWIN_HOST_DEVICE std::size_t operator()(std::size_t e) const { return (e / range) * width + column + e % range; }
};

// Ulysses' head groups: send (cp, rows, group) <-> the range of local (rows, width) starting at `column`, of `heads`
// heads of D: block d holds heads [d heads / cp, (d + 1) heads / cp) of every row (group = heads / cp * D).
struct HeadGroups {
  std::size_t rows = 0, width = 0, column = 0, group = 0;
  TWIN_HOST_DEVICE std::size_t operator()(std::size_t e) const {
    const std::size_t d = e / (rows * group), rest = e % (rows * group);
    return (rest / group) * width + column + d * group + rest % group;
  }
};

// Ulysses' sequence order: blocks (cp, B, L, range), block r being rank r's local tokens <-> the range of full
// (B, seq, width) starting at `column`, each token at its place in the whole sequence.
struct SequenceBlocks {
  int batch = 1, seq = 0, cp = 1;
  std::size_t width = 0, column = 0, range = 0;
  TWIN_HOST_DEVICE std::size_t operator()(std::size_t e) const {
    const std::size_t len = static_cast<std::size_t>(seq / cp), c = e % range,
                      token = e / range;  // token of (cp, B, L)
    const int local = static_cast<int>(token % len);
    const std::size_t rest = token / len, b = rest % static_cast<std::size_t>(batch);
    const int rank = static_cast<int>(rest / static_cast<std::size_t>(batch));
    return (b * static_cast<std::size_t>(seq) + static_cast<std::size_t>(position_of(local, rank, seq, cp))) * width +
           column + c;
  }
};

}  // namespace twin::kernels::cuda::context

// Context-parallel attention from flash_attention.hpp's block functions: every rank runs FlashBlocks of its query
// chunks against key chunks at their absolute positions, so the causal mask and ALiBi see the true positions, and the
// partial outputs merge by their lse exactly as the whole sequence's tiles do.
#include "kernels/cpu/ring_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/flash_attention.hpp"

namespace twin::kernels::cpu {

namespace {

using std::size_t;

void check_shape(const ContextParallelShape& s) {
  TWIN_KERNEL_CHECK(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 && s.cp > 0);
  TWIN_KERNEL_CHECK(s.heads % s.kv_heads == 0 && s.seq % (2 * s.cp) == 0);
}

// Rows of one local chunk (`part`) of a (batch, L, width) tensor, as a FlashBlock operand.
template <class T>
HeadRows<T> chunk_rows(T* data, int part, size_t width, const ContextParallelShape& s) {
  const size_t chunk = static_cast<size_t>(s.chunk_len());
  return {data + part * chunk * width, static_cast<size_t>(s.local_len()) * width, width};
}

size_t qkv_width(const ContextParallelShape& s) {
  return static_cast<size_t>(s.heads + 2 * s.kv_heads) * s.head_dim;
}
size_t kv_width(const ContextParallelShape& s) {
  return static_cast<size_t>(2 * s.kv_heads) * s.head_dim;
}
size_t out_width(const ContextParallelShape& s) {
  return static_cast<size_t>(s.heads) * s.head_dim;
}
size_t chunk_stats(const ContextParallelShape& s) {  // one chunk's lse or delta: (batch, H, C)
  return static_cast<size_t>(s.batch) * s.heads * s.chunk_len();
}

// The block of query chunk `q_part` of `rank` against key chunk `kv_part` of `source`; false when the causal mask
// hides every key of it from every query.
bool chunk_pair(FlashBlock& block, int rank, int q_part, int source, int kv_part, const ContextParallelShape& s) {
  const int chunk = s.chunk_len();
  block = FlashBlock{s.batch,
                     s.heads,
                     s.kv_heads,
                     s.head_dim,
                     cp_chunk_of(rank, q_part, s.cp) * chunk,
                     chunk,
                     cp_chunk_of(source, kv_part, s.cp) * chunk,
                     chunk,
                     s.alibi_slopes};
  return block.kv_start <= block.q_start + chunk - 1;
}

// Copies `rows` token rows of `width` between (batch, from_len, width) and (batch, to_len, width) tensors.
void copy_rows(float* to, int to_len, int to_row, const float* from, int from_len, int from_row, int rows, int width,
               int batch) {
  for (int b = 0; b < batch; ++b) {
    const float* src = from + (static_cast<size_t>(b) * from_len + from_row) * width;
    std::copy(src, src + static_cast<size_t>(rows) * width, to + (static_cast<size_t>(b) * to_len + to_row) * width);
  }
}

}  // namespace

int cp_chunk_of(int rank, int part, int cp) {
  return part == 0 ? rank : 2 * cp - 1 - rank;
}

void cp_take_local(float* local, const float* full, int batch, int seq, int width, int cp, int rank) {
  TWIN_KERNEL_CHECK(cp > 0 && seq % (2 * cp) == 0 && rank >= 0 && rank < cp);
  const int chunk = seq / (2 * cp), len = seq / cp;
  for (int part = 0; part < 2; ++part) {
    copy_rows(local, len, part * chunk, full, seq, cp_chunk_of(rank, part, cp) * chunk, chunk, width, batch);
  }
}

void cp_put_local(float* full, const float* local, int batch, int seq, int width, int cp, int rank) {
  TWIN_KERNEL_CHECK(cp > 0 && seq % (2 * cp) == 0 && rank >= 0 && rank < cp);
  const int chunk = seq / (2 * cp), len = seq / cp;
  for (int part = 0; part < 2; ++part) {
    copy_rows(full, seq, cp_chunk_of(rank, part, cp) * chunk, local, len, part * chunk, chunk, width, batch);
  }
}

void cp_pack_kv(float* kv, const float* qkv, int batch, int len, int heads, int kv_heads, int head_dim) {
  const size_t q = static_cast<size_t>(heads) * head_dim, kvw = static_cast<size_t>(2 * kv_heads) * head_dim;
  for (size_t t = 0; t < static_cast<size_t>(batch) * len; ++t) {
    std::copy(qkv + t * (q + kvw) + q, qkv + (t + 1) * (q + kvw), kv + t * kvw);
  }
}

void cp_add_kv_gradient(float* dqkv, const float* dkv, int batch, int len, int heads, int kv_heads, int head_dim) {
  const size_t q = static_cast<size_t>(heads) * head_dim, kvw = static_cast<size_t>(2 * kv_heads) * head_dim;
  for (size_t t = 0; t < static_cast<size_t>(batch) * len; ++t) {
    for (size_t i = 0; i < kvw; ++i) dqkv[t * (q + kvw) + q + i] += dkv[t * kvw + i];
  }
}

size_t cp_kv_block_elements(const ContextParallelShape& s) {
  return static_cast<size_t>(s.batch) * s.local_len() * kv_width(s);
}

void ring_attention_forward_step(float* out_local, float* lse, const float* qkv_local, const float* kv_source, int rank,
                                 int source, const ContextParallelShape& s) {
  check_shape(s);
  TWIN_KERNEL_CHECK(rank >= 0 && rank < s.cp && source >= 0 && source < s.cp);
  const size_t qkv_w = qkv_width(s), kv_w = kv_width(s), out_w = out_width(s), stats = chunk_stats(s);
  const size_t v_offset = static_cast<size_t>(s.kv_heads) * s.head_dim;
  if (source == rank) {  // the first step: nothing merged yet
    std::fill(out_local, out_local + static_cast<size_t>(s.batch) * s.local_len() * out_w, 0.0f);
    std::fill(lse, lse + 2 * stats, -std::numeric_limits<float>::infinity());
  }
  std::vector<float> partial_out(static_cast<size_t>(s.batch) * s.chunk_len() * out_w), partial_lse(stats);
  const HeadRows<const float> partial{partial_out.data(), static_cast<size_t>(s.chunk_len()) * out_w, out_w};
  for (int q_part = 0; q_part < 2; ++q_part) {
    for (int kv_part = 0; kv_part < 2; ++kv_part) {
      FlashBlock block;
      if (!chunk_pair(block, rank, q_part, source, kv_part, s)) continue;
      flash_attention_block_forward({partial_out.data(), partial.batch_stride, out_w}, partial_lse.data(),
                                    chunk_rows(qkv_local, q_part, qkv_w, s), chunk_rows(kv_source, kv_part, kv_w, s),
                                    chunk_rows(kv_source + v_offset, kv_part, kv_w, s), block);
      flash_attention_merge(chunk_rows(out_local, q_part, out_w, s), lse + q_part * stats, partial, partial_lse.data(),
                            s.batch, s.chunk_len(), s.heads, s.head_dim);
    }
  }
}

void ring_attention_delta(float* delta, const float* dout_local, const float* out_local,
                          const ContextParallelShape& s) {
  check_shape(s);
  const size_t out_w = out_width(s);
  for (int part = 0; part < 2; ++part) {
    flash_attention_delta(delta + part * chunk_stats(s), chunk_rows(dout_local, part, out_w, s),
                          chunk_rows(out_local, part, out_w, s), s.batch, s.chunk_len(), s.heads, s.head_dim);
  }
}

void ring_attention_backward_step(float* dq_local, float* dkv_source, const float* dout_local, const float* qkv_local,
                                  const float* kv_source, const float* lse, const float* delta, int rank, int source,
                                  const ContextParallelShape& s) {
  check_shape(s);
  TWIN_KERNEL_CHECK(rank >= 0 && rank < s.cp && source >= 0 && source < s.cp);
  const size_t qkv_w = qkv_width(s), kv_w = kv_width(s), out_w = out_width(s), stats = chunk_stats(s);
  const size_t v_offset = static_cast<size_t>(s.kv_heads) * s.head_dim;
  for (int q_part = 0; q_part < 2; ++q_part) {
    for (int kv_part = 0; kv_part < 2; ++kv_part) {
      FlashBlock block;
      if (!chunk_pair(block, rank, q_part, source, kv_part, s)) continue;
      flash_attention_block_backward(
          chunk_rows(dq_local, q_part, out_w, s), chunk_rows(dkv_source, kv_part, kv_w, s),
          chunk_rows(dkv_source + v_offset, kv_part, kv_w, s), chunk_rows(dout_local, q_part, out_w, s),
          chunk_rows(qkv_local, q_part, qkv_w, s), chunk_rows(kv_source, kv_part, kv_w, s),
          chunk_rows(kv_source + v_offset, kv_part, kv_w, s), lse + q_part * stats, delta + q_part * stats, block);
    }
  }
}

namespace {

// Query chunk `part` of `rank` against every key of the whole sequence it can see: [0, the chunk's end).
FlashBlock visible_prefix(int rank, int part, const ContextParallelShape& s) {
  const int chunk = s.chunk_len(), start = cp_chunk_of(rank, part, s.cp) * chunk;
  return FlashBlock{s.batch, s.heads, s.kv_heads, s.head_dim, start, chunk, 0, start + chunk, s.alibi_slopes};
}

}  // namespace

void all_gather_attention_forward(float* out_local, float* lse, const float* qkv_local, const float* kv_full, int rank,
                                  const ContextParallelShape& s) {
  check_shape(s);
  TWIN_KERNEL_CHECK(rank >= 0 && rank < s.cp);
  const size_t qkv_w = qkv_width(s), kv_w = kv_width(s), out_w = out_width(s);
  const size_t full = static_cast<size_t>(s.seq) * kv_w, v_offset = static_cast<size_t>(s.kv_heads) * s.head_dim;
  for (int part = 0; part < 2; ++part) {
    flash_attention_block_forward(chunk_rows(out_local, part, out_w, s), lse + part * chunk_stats(s),
                                  chunk_rows(qkv_local, part, qkv_w, s), {kv_full, full, kv_w},
                                  {kv_full + v_offset, full, kv_w}, visible_prefix(rank, part, s));
  }
}

void all_gather_attention_backward(float* dq_local, float* dkv_full, const float* dout_local, const float* qkv_local,
                                   const float* kv_full, const float* lse, const float* delta, int rank,
                                   const ContextParallelShape& s) {
  check_shape(s);
  TWIN_KERNEL_CHECK(rank >= 0 && rank < s.cp);
  const size_t qkv_w = qkv_width(s), kv_w = kv_width(s), out_w = out_width(s), stats = chunk_stats(s);
  const size_t full = static_cast<size_t>(s.seq) * kv_w, v_offset = static_cast<size_t>(s.kv_heads) * s.head_dim;
  for (int part = 0; part < 2; ++part) {
    flash_attention_block_backward(
        chunk_rows(dq_local, part, out_w, s), {dkv_full, full, kv_w}, {dkv_full + v_offset, full, kv_w},
        chunk_rows(dout_local, part, out_w, s), chunk_rows(qkv_local, part, qkv_w, s), {kv_full, full, kv_w},
        {kv_full + v_offset, full, kv_w}, lse + part * stats, delta + part * stats, visible_prefix(rank, part, s));
  }
}

namespace {

// For each head group d and each section, the offset of its heads in a full row and in a group's row.
template <class Visit>
void for_each_group_section(const std::vector<int>& section_heads, int head_dim, int cp, Visit visit) {
  size_t full_offset = 0, group_width = 0;
  for (int heads : section_heads) group_width += static_cast<size_t>(heads / cp) * head_dim;
  for (int d = 0; d < cp; ++d) {
    full_offset = 0;
    size_t group_offset = 0;
    for (int heads : section_heads) {
      const size_t width = static_cast<size_t>(heads / cp) * head_dim;
      visit(d, full_offset + d * width, group_offset, width, group_width);
      full_offset += static_cast<size_t>(heads) * head_dim;
      group_offset += width;
    }
  }
}

size_t row_width(const std::vector<int>& section_heads, int head_dim) {
  size_t width = 0;
  for (int heads : section_heads) width += static_cast<size_t>(heads) * head_dim;
  return width;
}

}  // namespace

void ulysses_split_heads(float* send, const float* local, int batch, int len, const std::vector<int>& section_heads,
                         int head_dim, int cp) {
  for (int heads : section_heads) TWIN_KERNEL_CHECK(cp > 0 && heads % cp == 0);
  const size_t rows = static_cast<size_t>(batch) * len, width = row_width(section_heads, head_dim);
  for_each_group_section(
      section_heads, head_dim, cp, [&](int d, size_t full_at, size_t group_at, size_t n, size_t group_width) {
        float* block = send + d * rows * group_width;
        for (size_t t = 0; t < rows; ++t) {
          std::copy(local + t * width + full_at, local + t * width + full_at + n, block + t * group_width + group_at);
        }
      });
}

void ulysses_join_heads(float* local, const float* recv, int batch, int len, const std::vector<int>& section_heads,
                        int head_dim, int cp) {
  for (int heads : section_heads) TWIN_KERNEL_CHECK(cp > 0 && heads % cp == 0);
  const size_t rows = static_cast<size_t>(batch) * len, width = row_width(section_heads, head_dim);
  for_each_group_section(section_heads, head_dim, cp,
                         [&](int d, size_t full_at, size_t group_at, size_t n, size_t group_width) {
                           const float* block = recv + d * rows * group_width;
                           for (size_t t = 0; t < rows; ++t) {
                             std::copy(block + t * group_width + group_at, block + t * group_width + group_at + n,
                                       local + t * width + full_at);
                           }
                         });
}

void cp_blocks_to_sequence(float* full, const float* blocks, int batch, int seq, int width, int cp) {
  TWIN_KERNEL_CHECK(cp > 0 && seq % (2 * cp) == 0);
  const size_t block = static_cast<size_t>(batch) * (seq / cp) * width;
  for (int s = 0; s < cp; ++s) cp_put_local(full, blocks + s * block, batch, seq, width, cp, s);
}

void cp_sequence_to_blocks(float* blocks, const float* full, int batch, int seq, int width, int cp) {
  TWIN_KERNEL_CHECK(cp > 0 && seq % (2 * cp) == 0);
  const size_t block = static_cast<size_t>(batch) * (seq / cp) * width;
  for (int s = 0; s < cp; ++s) cp_take_local(blocks + s * block, full, batch, seq, width, cp, s);
}

}  // namespace twin::kernels::cpu

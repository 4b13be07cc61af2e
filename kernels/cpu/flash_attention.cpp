#include "kernels/cpu/flash_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// element 0 of head `head`'s row at token t of sequence b
template <class T>
T* row(const HeadRows<T>& x, int b, int t, int head, int head_dim) {
  return x.data + static_cast<std::size_t>(b) * x.batch_stride + static_cast<std::size_t>(t) * x.token_stride +
         static_cast<std::size_t>(head) * head_dim;
}

// A (rows x cols) tile of scaled, biased, masked scores of query head h against its kv head g, as the CUDA kernels
// form it: s[r][c] = scale q_(i0+r) . k_(j0+c) + m_h (pos_key - pos_query), -inf where the key comes after the query.
void score_tile(float* s, const HeadRows<const float>& q, const HeadRows<const float>& k, const FlashBlock& x, int b,
                int h, int g, int i0, int rows, int j0, int cols, float scale) {
  const float slope = x.alibi_slopes != nullptr ? x.alibi_slopes[h] : 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* q_row = row(q, b, i0 + r, h, x.head_dim);
    const int query_position = x.q_start + i0 + r;
    for (int c = 0; c < cols; ++c) {
      const int key_position = x.kv_start + j0 + c;
      float& score = s[static_cast<std::size_t>(r) * cols + c];
      if (key_position > query_position) {
        score = kMinusInf;
        continue;
      }
      score = scale * detail::dot(q_row, row(k, b, j0 + c, g, x.head_dim), static_cast<std::size_t>(x.head_dim));
      if (x.alibi_slopes != nullptr) score += slope * static_cast<float>(key_position - query_position);
    }
  }
}

// keys [0, key_end) are visible to some query of the tile [i0, i0 + rows): those up to its last query's position
int key_end(const FlashBlock& x, int i0, int rows) {
  return std::clamp(x.q_start + i0 + rows - x.kv_start, 0, x.kv_len);
}

// queries [query_begin, q_len) see some key of the tile starting at j0: those at or after the key's position
int query_begin(const FlashBlock& x, int j0) {
  return std::clamp(x.kv_start + j0 - x.q_start, 0, x.q_len);
}

// P (rows x cols) = e^(S - lse) of a score tile, 0 where masked or where the row saw no key at all (lse -inf)
void probabilities(float* p, int rows, int cols, const float* row_lse) {
  for (int r = 0; r < rows; ++r) {
    const float lse = row_lse[r];
    for (int c = 0; c < cols; ++c) {
      float& x = p[static_cast<std::size_t>(r) * cols + c];
      x = (lse == kMinusInf || x == kMinusInf) ? 0.0f : std::exp(x - lse);
    }
  }
}

// dP (rows x cols) = dout_rows V_cols^T, then dS = P (dP - delta) in place
void score_gradient(float* ds, const float* p, int rows, int cols, const HeadRows<const float>& dout,
                    const HeadRows<const float>& v, const FlashBlock& x, int b, int h, int g, int i0, int j0,
                    const float* row_delta) {
  for (int r = 0; r < rows; ++r) {
    const float* dy = row(dout, b, i0 + r, h, x.head_dim);
    for (int c = 0; c < cols; ++c) {
      const std::size_t at = static_cast<std::size_t>(r) * cols + c;
      const float dp = detail::dot(dy, row(v, b, j0 + c, g, x.head_dim), static_cast<std::size_t>(x.head_dim));
      ds[at] = p[at] * (dp - row_delta[r]);
    }
  }
}

void check_block(const FlashBlock& x) {
  TWIN_KERNEL_CHECK(x.batch > 0 && x.heads > 0 && x.kv_heads > 0 && x.head_dim > 0);
  TWIN_KERNEL_CHECK(x.heads % x.kv_heads == 0);
  TWIN_KERNEL_CHECK(x.q_len >= 0 && x.kv_len >= 0);
}

// The forward of one query tile of one head: rows [i0, i0 + rows) of query head h.
void forward_tile(const HeadRows<float>& out, float* lse, const HeadRows<const float>& q,
                  const HeadRows<const float>& k, const HeadRows<const float>& v, const FlashBlock& x, int b, int h,
                  int i0, int rows) {
  const int D = x.head_dim, g = h / (x.heads / x.kv_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> m(rows, kMinusInf), l(rows, 0.0f);                  // running max and sum per row
  std::vector<float> o(static_cast<std::size_t>(rows) * D, 0.0f);        // (rows, D) running output
  std::vector<float> s(static_cast<std::size_t>(rows) * kFlashKeyTile);  // (rows, Bc) scores, then e^(S - m')
  const int keys = key_end(x, i0, rows);
  for (int j0 = 0; j0 < keys; j0 += kFlashKeyTile) {
    const int cols = std::min(kFlashKeyTile, x.kv_len - j0);
    score_tile(s.data(), q, k, x, b, h, g, i0, rows, j0, cols, scale);
    for (int r = 0; r < rows; ++r) {
      float* p = s.data() + static_cast<std::size_t>(r) * cols;
      const float m_new = std::max(m[r], detail::max(p, static_cast<std::size_t>(cols)));
      const float base = m_new == kMinusInf ? 0.0f : m_new;  // a row that has seen no key yet: every term is 0
      const float alpha = std::exp(m[r] - base);             // rescales what the earlier tiles summed
      for (int c = 0; c < cols; ++c) p[c] = std::exp(p[c] - base);
      l[r] = alpha * l[r] + detail::sum(p, static_cast<std::size_t>(cols));
      m[r] = m_new;
      float* o_row = o.data() + static_cast<std::size_t>(r) * D;
      for (int d = 0; d < D; ++d) o_row[d] *= alpha;
      for (int c = 0; c < cols; ++c) {
        const float* v_row = row(v, b, j0 + c, g, D);
        for (int d = 0; d < D; ++d) o_row[d] += p[c] * v_row[d];
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* out_row = row(out, b, i0 + r, h, D);
    const float* o_row = o.data() + static_cast<std::size_t>(r) * D;
    const float inv_l = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int d = 0; d < D; ++d) out_row[d] = o_row[d] * inv_l;
    lse[(static_cast<std::size_t>(b) * x.heads + h) * x.q_len + i0 + r] =
        l[r] > 0.0f ? m[r] + std::log(l[r]) : kMinusInf;
  }
}

// The dk/dv pass for one key tile of kv head g: keys [j0, j0 + cols), every query head of its group in order.
void key_tile_backward(const HeadRows<float>& dk, const HeadRows<float>& dv, const HeadRows<const float>& dout,
                       const HeadRows<const float>& q, const HeadRows<const float>& k, const HeadRows<const float>& v,
                       const float* lse, const float* delta, const FlashBlock& x, int b, int g, int j0, int cols) {
  const int D = x.head_dim, group = x.heads / x.kv_heads, tile = flash_backward_query_tile(D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> dk_acc(static_cast<std::size_t>(cols) * D, 0.0f), dv_acc(dk_acc.size(), 0.0f);  // (cols, D)
  std::vector<float> p(static_cast<std::size_t>(tile) * cols), ds(p.size());                         // (rows, cols)
  const int first = query_begin(x, j0) / tile * tile;  // query tiles start at multiples of `tile`, as on the GPU
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const std::size_t head_row = (static_cast<std::size_t>(b) * x.heads + h) * x.q_len;
    for (int i0 = first; i0 < x.q_len; i0 += tile) {
      const int rows = std::min(tile, x.q_len - i0);
      score_tile(p.data(), q, k, x, b, h, g, i0, rows, j0, cols, scale);
      probabilities(p.data(), rows, cols, lse + head_row + i0);
      score_gradient(ds.data(), p.data(), rows, cols, dout, v, x, b, h, g, i0, j0, delta + head_row + i0);
      for (int r = 0; r < rows; ++r) {  // dV += P^T dout, dK += dS^T Q (scaled once, below)
        const float* dy = row(dout, b, i0 + r, h, D);
        const float* q_row = row(q, b, i0 + r, h, D);
        for (int c = 0; c < cols; ++c) {
          const float pc = p[static_cast<std::size_t>(r) * cols + c], dsc = ds[static_cast<std::size_t>(r) * cols + c];
          float* dv_row = dv_acc.data() + static_cast<std::size_t>(c) * D;
          float* dk_row = dk_acc.data() + static_cast<std::size_t>(c) * D;
          for (int d = 0; d < D; ++d) {
            dv_row[d] += pc * dy[d];
            dk_row[d] += dsc * q_row[d];
          }
        }
      }
    }
  }
  for (int c = 0; c < cols; ++c) {
    float* dk_row = row(dk, b, j0 + c, g, D);
    float* dv_row = row(dv, b, j0 + c, g, D);
    for (int d = 0; d < D; ++d) {
      dk_row[d] += scale * dk_acc[static_cast<std::size_t>(c) * D + d];
      dv_row[d] += dv_acc[static_cast<std::size_t>(c) * D + d];
    }
  }
}

// The dq pass for one query tile of query head h: rows [i0, i0 + rows), every key tile it sees in order.
void query_tile_backward(const HeadRows<float>& dq, const HeadRows<const float>& dout, const HeadRows<const float>& q,
                         const HeadRows<const float>& k, const HeadRows<const float>& v, const float* lse,
                         const float* delta, const FlashBlock& x, int b, int h, int i0, int rows) {
  const int D = x.head_dim, g = h / (x.heads / x.kv_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::size_t head_row = (static_cast<std::size_t>(b) * x.heads + h) * x.q_len;
  std::vector<float> dq_acc(static_cast<std::size_t>(rows) * D, 0.0f);                 // (rows, D)
  std::vector<float> p(static_cast<std::size_t>(rows) * kFlashKeyTile), ds(p.size());  // (rows, Bc)
  const int keys = key_end(x, i0, rows);
  for (int j0 = 0; j0 < keys; j0 += kFlashKeyTile) {
    const int cols = std::min(kFlashKeyTile, x.kv_len - j0);
    score_tile(p.data(), q, k, x, b, h, g, i0, rows, j0, cols, scale);
    probabilities(p.data(), rows, cols, lse + head_row + i0);
    score_gradient(ds.data(), p.data(), rows, cols, dout, v, x, b, h, g, i0, j0, delta + head_row + i0);
    for (int r = 0; r < rows; ++r) {  // dQ += dS K (scaled once, below)
      float* dq_row = dq_acc.data() + static_cast<std::size_t>(r) * D;
      for (int c = 0; c < cols; ++c) {
        const float dsc = ds[static_cast<std::size_t>(r) * cols + c];
        const float* k_row = row(k, b, j0 + c, g, D);
        for (int d = 0; d < D; ++d) dq_row[d] += dsc * k_row[d];
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* dq_row = row(dq, b, i0 + r, h, D);
    for (int d = 0; d < D; ++d) dq_row[d] += scale * dq_acc[static_cast<std::size_t>(r) * D + d];
  }
}

// The operands of a packed qkv (batch, seq, (H + 2 KV) D) and an output (batch, seq, H D)
struct Packed {
  std::size_t qkv_token, qkv_batch, out_token, out_batch, k_offset, v_offset;
  Packed(int seq, int heads, int kv_heads, int head_dim) {
    qkv_token = static_cast<std::size_t>(heads + 2 * kv_heads) * head_dim;
    qkv_batch = qkv_token * seq;
    out_token = static_cast<std::size_t>(heads) * head_dim;
    out_batch = out_token * seq;
    k_offset = static_cast<std::size_t>(heads) * head_dim;
    v_offset = static_cast<std::size_t>(heads + kv_heads) * head_dim;
  }
  template <class T>
  HeadRows<T> in(T* base, std::size_t offset) const {
    return {base + offset, qkv_batch, qkv_token};
  }
  template <class T>
  HeadRows<T> out(T* base) const {
    return {base, out_batch, out_token};
  }
};

}  // namespace

void flash_attention_block_forward(HeadRows<float> out, float* lse, HeadRows<const float> q, HeadRows<const float> k,
                                   HeadRows<const float> v, const FlashBlock& block) {
  check_block(block);
  TWIN_KERNEL_CHECK(out.data != nullptr && lse != nullptr && q.data != nullptr && k.data != nullptr &&
                    v.data != nullptr);
  for (int b = 0; b < block.batch; ++b) {
    for (int h = 0; h < block.heads; ++h) {
      for (int i0 = 0; i0 < block.q_len; i0 += kFlashQueryTile) {
        forward_tile(out, lse, q, k, v, block, b, h, i0, std::min(kFlashQueryTile, block.q_len - i0));
      }
    }
  }
}

void flash_attention_merge(HeadRows<float> out, float* lse, HeadRows<const float> out_b, const float* lse_b, int batch,
                           int len, int heads, int head_dim) {
  TWIN_KERNEL_CHECK(batch > 0 && len >= 0 && heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(out.data != nullptr && lse != nullptr && out_b.data != nullptr && lse_b != nullptr);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < len; ++t) {
        const std::size_t at = (static_cast<std::size_t>(b) * heads + h) * len + t;
        const float a = lse[at], c = lse_b[at], high = std::max(a, c);
        if (high == kMinusInf) continue;  // neither partial saw a key: out stays 0
        const float merged = high + std::log(std::exp(a - high) + std::exp(c - high));
        const float wa = std::exp(a - merged), wb = std::exp(c - merged);
        float* o = row(out, b, t, h, head_dim);
        const float* ob = row(out_b, b, t, h, head_dim);
        for (int d = 0; d < head_dim; ++d) o[d] = wa * o[d] + wb * ob[d];
        lse[at] = merged;
      }
    }
  }
}

void flash_attention_delta(float* delta, HeadRows<const float> dout, HeadRows<const float> out, int batch, int len,
                           int heads, int head_dim) {
  TWIN_KERNEL_CHECK(batch > 0 && len >= 0 && heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(delta != nullptr && dout.data != nullptr && out.data != nullptr);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < len; ++t) {
        delta[(static_cast<std::size_t>(b) * heads + h) * len + t] =
            detail::dot(row(dout, b, t, h, head_dim), row(out, b, t, h, head_dim), static_cast<std::size_t>(head_dim));
      }
    }
  }
}

void flash_attention_block_backward(HeadRows<float> dq, HeadRows<float> dk, HeadRows<float> dv,
                                    HeadRows<const float> dout, HeadRows<const float> q, HeadRows<const float> k,
                                    HeadRows<const float> v, const float* lse, const float* delta,
                                    const FlashBlock& block) {
  check_block(block);
  TWIN_KERNEL_CHECK(dq.data != nullptr && dk.data != nullptr && dv.data != nullptr && dout.data != nullptr);
  TWIN_KERNEL_CHECK(q.data != nullptr && k.data != nullptr && v.data != nullptr && lse != nullptr && delta != nullptr);
  for (int b = 0; b < block.batch; ++b) {
    for (int g = 0; g < block.kv_heads; ++g) {
      for (int j0 = 0; j0 < block.kv_len; j0 += kFlashKeyTile) {
        key_tile_backward(dk, dv, dout, q, k, v, lse, delta, block, b, g, j0,
                          std::min(kFlashKeyTile, block.kv_len - j0));
      }
    }
    for (int h = 0; h < block.heads; ++h) {
      for (int i0 = 0; i0 < block.q_len; i0 += kFlashQueryTile) {
        query_tile_backward(dq, dout, q, k, v, lse, delta, block, b, h, i0,
                            std::min(kFlashQueryTile, block.q_len - i0));
      }
    }
  }
}

void flash_attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int kv_heads,
                             int head_dim, const float* alibi_slopes) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0);
  TWIN_KERNEL_CHECK(out != nullptr && lse != nullptr && qkv != nullptr && out != qkv);
  const Packed x(seq, heads, kv_heads, head_dim);
  const FlashBlock block{batch, heads, kv_heads, head_dim, 0, seq, 0, seq, alibi_slopes};
  flash_attention_block_forward(x.out(out), lse, x.in(qkv, 0), x.in(qkv, x.k_offset), x.in(qkv, x.v_offset), block);
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int batch, int seq, int heads, int kv_heads, int head_dim, const float* alibi_slopes) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0);
  TWIN_KERNEL_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && out != nullptr && lse != nullptr);
  TWIN_KERNEL_CHECK(dqkv != dout && dqkv != qkv && dqkv != out);
  const Packed x(seq, heads, kv_heads, head_dim);
  std::fill(dqkv, dqkv + static_cast<std::size_t>(batch) * x.qkv_batch, 0.0f);
  std::vector<float> delta(static_cast<std::size_t>(batch) * heads * seq);  // (batch, heads, seq)
  flash_attention_delta(delta.data(), x.out(dout), x.out(out), batch, seq, heads, head_dim);
  const FlashBlock block{batch, heads, kv_heads, head_dim, 0, seq, 0, seq, alibi_slopes};
  flash_attention_block_backward(x.in(dqkv, 0), x.in(dqkv, x.k_offset), x.in(dqkv, x.v_offset), x.out(dout),
                                 x.in(qkv, 0), x.in(qkv, x.k_offset), x.in(qkv, x.v_offset), lse, delta.data(), block);
}

}  // namespace twin::kernels::cpu

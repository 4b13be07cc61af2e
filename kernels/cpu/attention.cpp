#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

namespace {

using detail::gemm;

// Query rows per block. Block i (rows [i*kBlock, (i+1)*kBlock)) is scored against keys [0, (i+1)*kBlock): the
// (seq, seq) matrix is covered by nb(nb+1)/2 of its nb^2 blocks, i.e. 1 + 1/nb times the causal work (1.25 at
// seq 256), in GEMMs large enough for BLAS to run near its peak.
constexpr int kBlock = 64;

// x[i] = exp(scale x[i] - shift), for the softmax's arguments (<= 0 up to rounding), by exp_cephes (exp.hpp): no
// softmax weight is lost below -87, and the loop vectorizes. Each element's bits depend on its value alone, not on n
// or on its position.
void exp_shifted(float* x, int n, float scale, float shift) {
  for (int i = 0; i < n; ++i) x[i] = detail::exp_cephes(scale * x[i] - shift);
}

// Row t's ALiBi bias on the UNSCALED scores: s[t2] += step (t2 - t) for t2 <= t, step = m / scale, so that the
// exp_shifted(s, t + 1, scale, shift) after it takes exp(scale s + m (t2 - t) - shift) (up to rounding: one rounding
// of step and two per element, next to the GEMM's own). Folding the bias into the unscaled scores leaves exp_shifted,
// which applies the scale, as it was; with step 0 (slope 0) every score keeps its value, s + 0 (t2 - t) = s, so the
// results keep the bits of the path without ALiBi. The forward and the backward call it alike, so the backward's
// recomputed p carries the bias the forward's lse did.
void add_alibi_bias(float* s, int t, float step) {
  for (int t2 = 0; t2 <= t; ++t2) s[t2] += step * static_cast<float>(t2 - t);
}

// the ALiBi slopes of the `heads` local heads, when given, are finite (a NaN would spread over whole rows)
bool finite_slopes(const float* slopes, int heads) {
  if (slopes == nullptr) return true;
  for (int h = 0; h < heads; ++h) {
    if (!std::isfinite(slopes[h])) return false;
  }
  return true;
}

// One (batch, query head) slice of the (batch, seq, (heads + 2*kv_heads)*head_dim) layout, with its kv head: row t
// of q, k or v and of the (batch, seq, heads, head_dim) output. With kv_heads == heads (kv head = query head) the
// offsets are those of the (batch, seq, 3, heads, head_dim) layout.
struct Head {
  int seq, head_dim;
  std::size_t qkv_row, out_row;  // floats between consecutive tokens: (H + 2 KV) D and H D
  std::size_t q_base, k_base, v_base, out_base;

  Head(int b, int h, int kv_head, int seq_, int heads, int kv_heads, int head_dim_) : seq(seq_), head_dim(head_dim_) {
    const std::size_t D = static_cast<std::size_t>(head_dim_);
    out_row = static_cast<std::size_t>(heads) * D;
    qkv_row = static_cast<std::size_t>(heads + 2 * kv_heads) * D;
    const std::size_t token0 = static_cast<std::size_t>(b) * seq * qkv_row;
    q_base = token0 + static_cast<std::size_t>(h) * D;
    k_base = token0 + static_cast<std::size_t>(heads + kv_head) * D;
    v_base = token0 + static_cast<std::size_t>(heads + kv_heads + kv_head) * D;
    out_base = static_cast<std::size_t>(b) * seq * out_row + static_cast<std::size_t>(h) * D;
  }
  std::size_t q(int t) const { return q_base + t * qkv_row; }
  std::size_t k(int t) const { return k_base + t * qkv_row; }
  std::size_t v(int t) const { return v_base + t * qkv_row; }
  std::size_t out(int t) const { return out_base + t * out_row; }
};

// dense (seq, head_dim) <- the head's rows of src, starting at offset(t)
template <class Offset>
void gather(float* dense, const float* src, const Head& x, Offset offset) {
  for (int t = 0; t < x.seq; ++t) {
    const float* row = src + offset(t);
    std::copy(row, row + x.head_dim, dense + static_cast<std::size_t>(t) * x.head_dim);
  }
}

// the head's rows of dst, starting at offset(t) <- dense (seq, head_dim)
template <class Offset>
void scatter(float* dst, const float* dense, const Head& x, Offset offset) {
  for (int t = 0; t < x.seq; ++t) {
    const float* row = dense + static_cast<std::size_t>(t) * x.head_dim;
    std::copy(row, row + x.head_dim, dst + offset(t));
  }
}

// The forward of kernels/cpu/attention.hpp, its arguments checked by the caller. The query heads of kv head g,
// [g group, (g+1) group), run one after the other on g's k and v, gathered once; the heads' order, and each head's
// operations, are those of multi-head attention, so kv_heads == heads gives its bits.
void forward_impl(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                  const float* alibi_slopes) {
  const int T = seq, D = head_dim, group = heads / kv_heads;
  const std::size_t td = static_cast<std::size_t>(T) * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(td), k(td), v(td);                      // (T, D) each: this head's q, its kv head's k, v
  std::vector<float> o(td);                                    // (T, D): its output
  std::vector<float> s(static_cast<std::size_t>(kBlock) * T);  // (rows, end): a block of scores, then probabilities

  for (int b = 0; b < batch; ++b) {
    for (int g = 0; g < kv_heads; ++g) {
      const Head kv(b, g * group, g, T, heads, kv_heads, D);
      gather(k.data(), qkv, kv, [&](int t) { return kv.k(t); });
      gather(v.data(), qkv, kv, [&](int t) { return kv.v(t); });
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const Head x(b, h, g, T, heads, kv_heads, D);
        gather(q.data(), qkv, x, [&](int t) { return x.q(t); });
        float* row_lse = lse + (static_cast<std::size_t>(b) * heads + h) * T;
        const float alibi_step = alibi_slopes != nullptr ? alibi_slopes[h] / scale : 0.0f;
        for (int i0 = 0; i0 < T; i0 += kBlock) {
          const int end = std::min(T, i0 + kBlock), rows = end - i0;  // queries [i0, end) see keys [0, end)
          gemm(false, true, rows, end, D, q.data() + static_cast<std::size_t>(i0) * D, k.data(), 0.0f, s.data());
          for (int r = 0; r < rows; ++r) {  // P = causal softmax(scale S + ALiBi bias), row by row, in place
            const int t = i0 + r;
            float* p = s.data() + static_cast<std::size_t>(r) * end;
            if (alibi_slopes != nullptr) add_alibi_bias(p, t, alibi_step);
            const float max_score = scale * detail::max(p, t + 1);
            exp_shifted(p, t + 1, scale, max_score);
            const float sum = detail::sum(p, t + 1);
            const float inv_sum = 1.0f / sum;
            for (int t2 = 0; t2 <= t; ++t2) p[t2] *= inv_sum;
            std::fill(p + t + 1, p + end, 0.0f);
            row_lse[t] = max_score + std::log(sum);
          }
          // O (rows, D) = P (rows, end) @ V (end, D)
          gemm(false, false, rows, D, end, s.data(), v.data(), 0.0f, o.data() + static_cast<std::size_t>(i0) * D);
        }
        scatter(out, o.data(), x, [&](int t) { return x.out(t); });
      }
    }
  }
}

// The backward of kernels/cpu/attention.hpp, its arguments checked by the caller. dK and dV of kv head g are summed
// over its query heads in their order, each head's blocks in theirs (GEMMs with beta 1 into the same dk, dv), then
// written once: deterministic, and with kv_heads == heads (one query head per kv head) multi-head attention's bits.
void backward_impl(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq, int heads,
                   int kv_heads, int head_dim, const float* alibi_slopes) {
  const int T = seq, D = head_dim, group = heads / kv_heads;
  const std::size_t td = static_cast<std::size_t>(T) * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(td), k(td), v(td), dy(td);               // (T, D) each: this head's q, dout, its kv head's k, v
  std::vector<float> dq(td), dk(td), dv(td);                    // (T, D) each: their gradients
  std::vector<float> s(static_cast<std::size_t>(kBlock) * T);   // (rows, end): S, then P
  std::vector<float> dp(static_cast<std::size_t>(kBlock) * T);  // (rows, end): dP, then dS

  for (int b = 0; b < batch; ++b) {
    for (int g = 0; g < kv_heads; ++g) {
      const Head kv(b, g * group, g, T, heads, kv_heads, D);
      gather(k.data(), qkv, kv, [&](int t) { return kv.k(t); });
      gather(v.data(), qkv, kv, [&](int t) { return kv.v(t); });
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const Head x(b, h, g, T, heads, kv_heads, D);
        gather(q.data(), qkv, x, [&](int t) { return x.q(t); });
        gather(dy.data(), dout, x, [&](int t) { return x.out(t); });
        const float* row_lse = lse + (static_cast<std::size_t>(b) * heads + h) * T;
        const float alibi_step = alibi_slopes != nullptr ? alibi_slopes[h] / scale : 0.0f;
        for (int i0 = 0; i0 < T; i0 += kBlock) {
          const int end = std::min(T, i0 + kBlock), rows = end - i0;  // queries [i0, end) see keys [0, end)
          const float* q_block = q.data() + static_cast<std::size_t>(i0) * D;
          const float* dy_block = dy.data() + static_cast<std::size_t>(i0) * D;
          gemm(false, true, rows, end, D, q_block, k.data(), 0.0f, s.data());    // S = Q K^T
          gemm(false, true, rows, end, D, dy_block, v.data(), 0.0f, dp.data());  // dP = dO V^T
          for (int r = 0; r < rows; ++r) {
            // p = exp(scale s + m (t2 - t) - lse);  softmax backward: ds = p (dp - sum p dp);  the score is
            // scale q.k + a constant  =>  dS = scale ds (the ALiBi bias has no gradient)
            const int t = i0 + r;
            float* p = s.data() + static_cast<std::size_t>(r) * end;
            float* ds = dp.data() + static_cast<std::size_t>(r) * end;
            if (alibi_slopes != nullptr) add_alibi_bias(p, t, alibi_step);
            exp_shifted(p, t + 1, scale, row_lse[t]);
            const float p_dp = detail::dot(p, ds, t + 1);
            for (int t2 = 0; t2 <= t; ++t2) ds[t2] = scale * p[t2] * (ds[t2] - p_dp);
            std::fill(p + t + 1, p + end, 0.0f);
            std::fill(ds + t + 1, ds + end, 0.0f);
          }
          const float* p = s.data();
          const float* ds = dp.data();
          float* dq_block = dq.data() + static_cast<std::size_t>(i0) * D;
          gemm(false, false, rows, D, end, ds, k.data(), 0.0f, dq_block);  // dQ (rows, D) = dS K[0, end)
          gemm(true, false, end, D, rows, ds, q_block, 1.0f, dk.data());   // dK[0, end) += dS^T Q (blocks in order)
          gemm(true, false, end, D, rows, p, dy_block, 1.0f, dv.data());   // dV[0, end) += P^T dO
        }
        scatter(dqkv, dq.data(), x, [&](int t) { return x.q(t); });
      }
      scatter(dqkv, dk.data(), kv, [&](int t) { return kv.k(t); });
      scatter(dqkv, dv.data(), kv, [&](int t) { return kv.v(t); });
    }
  }
}

}  // namespace

std::vector<float> alibi_slopes(int total_heads) {
  TWIN_KERNEL_CHECK(total_heads > 0);
  // slope i of p heads, p a power of two: start^(i+1) = 2^(-8 (i+1) / p), its exponent exact in double, rounded once to
  // fp32 (BigScience also holds the slopes as an fp32 tensor)
  const auto power_of_two_slope = [](double p, int i) { return static_cast<float>(std::exp2(-8.0 * (i + 1) / p)); };
  const int c = static_cast<int>(std::bit_floor(static_cast<unsigned>(total_heads)));  // 2^floor(log2 n)
  std::vector<float> slopes(static_cast<std::size_t>(total_heads));
  for (int i = 0; i < total_heads; ++i) {  // c's own slopes, then the even-indexed ones of 2c (all of them when n = c)
    slopes[static_cast<std::size_t>(i)] = i < c ? power_of_two_slope(c, i) : power_of_two_slope(2.0 * c, 2 * (i - c));
  }
  return slopes;
}

void attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int head_dim,
                       const float* alibi_slopes) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(out != nullptr && lse != nullptr && qkv != nullptr);
  TWIN_KERNEL_CHECK(out != qkv);
  TWIN_KERNEL_CHECK(finite_slopes(alibi_slopes, heads));
  forward_impl(out, lse, qkv, batch, seq, heads, heads, head_dim, alibi_slopes);
}

void attention_forward_gqa(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int kv_heads,
                           int head_dim, const float* alibi_slopes) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(heads % kv_heads == 0);
  TWIN_KERNEL_CHECK(out != nullptr && lse != nullptr && qkv != nullptr);
  TWIN_KERNEL_CHECK(out != qkv);
  TWIN_KERNEL_CHECK(finite_slopes(alibi_slopes, heads));
  forward_impl(out, lse, qkv, batch, seq, heads, kv_heads, head_dim, alibi_slopes);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                        int heads, int head_dim, const float* alibi_slopes) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && lse != nullptr);
  TWIN_KERNEL_CHECK(dqkv != dout && dqkv != qkv);
  TWIN_KERNEL_CHECK(finite_slopes(alibi_slopes, heads));
  backward_impl(dqkv, dout, qkv, lse, batch, seq, heads, heads, head_dim, alibi_slopes);
}

void attention_backward_gqa(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                            int heads, int kv_heads, int head_dim, const float* alibi_slopes) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(heads % kv_heads == 0);
  TWIN_KERNEL_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && lse != nullptr);
  TWIN_KERNEL_CHECK(dqkv != dout && dqkv != qkv);
  TWIN_KERNEL_CHECK(finite_slopes(alibi_slopes, heads));
  backward_impl(dqkv, dout, qkv, lse, batch, seq, heads, kv_heads, head_dim, alibi_slopes);
}

}  // namespace twin::kernels::cpu

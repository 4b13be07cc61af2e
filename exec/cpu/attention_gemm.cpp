#include "exec/cpu/attention_gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "exec/cpu/thread_pool.hpp"
#include "kernels/cpu/matmul.hpp"

namespace twin::exec::cpu {
namespace {

namespace k = twin::kernels::cpu;

// Per-thread scratch, grown on demand and kept (a (T, T) block is too large for the stack and too slow to map anew).
struct Scratch {
  std::vector<float> q, k, v, kt, vt, d_out, s, p, dp, dq, dk, dv;
  void resize(std::size_t td, std::size_t tt) {
    for (auto* x : {&q, &k, &v, &kt, &vt, &d_out, &dq, &dk, &dv}) x->resize(td);
    for (auto* x : {&s, &p, &dp}) x->resize(tt);
  }
};
Scratch& scratch() {
  thread_local Scratch instance;
  return instance;
}

// C (rows_c, cols_c) += A^T B with A (rows, rows_c) and B (rows, cols_c): matmul_backward's weight gradient
// (dweight += dout^T inp), asking it for nothing else. Its `weight` argument is then unused; B stands in for it.
void add_a_transpose_b(float* c, const float* a, const float* b, int rows, int rows_c, int cols_c) {
  k::matmul_backward(nullptr, c, nullptr, a, b, b, rows, cols_c, rows_c);
}

struct Layout {
  int batch, seq, heads, head_dim;
  std::size_t hidden() const { return static_cast<std::size_t>(heads) * head_dim; }
  // element (t, d) of q (which = 0), k (1) or v (2) of head h in batch b of a (B, T, 3, H, D) tensor
  std::size_t qkv_index(int b, int t, int which, int h) const {
    return ((static_cast<std::size_t>(b) * seq + t) * 3 + which) * hidden() + static_cast<std::size_t>(h) * head_dim;
  }
  std::size_t out_index(int b, int t, int h) const {
    return (static_cast<std::size_t>(b) * seq + t) * hidden() + static_cast<std::size_t>(h) * head_dim;
  }
};

void check(bool condition, const char* what) {
  if (!condition) throw std::invalid_argument(std::string("attention_gemm: precondition failed: ") + what);
}

void for_each_head(const Layout& x, ThreadPool* pool, const std::function<void(int, int)>& fn) {
  const int tasks = x.batch * x.heads;
  auto run = [&](int i) { fn(i / x.heads, i % x.heads); };
  if (pool != nullptr) {
    pool->parallel_for(tasks, run);
  } else {
    for (int i = 0; i < tasks; ++i) run(i);
  }
}

}  // namespace

void attention_forward_gemm(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int head_dim,
                            ThreadPool* pool) {
  check(batch > 0 && seq > 0 && heads > 0 && head_dim > 0, "positive sizes");
  check(out != nullptr && lse != nullptr && qkv != nullptr && out != qkv, "distinct non-null buffers");
  const Layout x{batch, seq, heads, head_dim};
  const int T = seq, D = head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for_each_head(x, pool, [&](int b, int h) {
    Scratch& w = scratch();
    w.resize(static_cast<std::size_t>(T) * D, static_cast<std::size_t>(T) * T);
    for (int t = 0; t < T; ++t) {  // Q, K (T, D) and V^T (D, T) of this head
      const float* q = qkv + x.qkv_index(b, t, 0, h);
      const float* kk = qkv + x.qkv_index(b, t, 1, h);
      const float* v = qkv + x.qkv_index(b, t, 2, h);
      std::copy(q, q + D, w.q.data() + static_cast<std::size_t>(t) * D);
      std::copy(kk, kk + D, w.k.data() + static_cast<std::size_t>(t) * D);
      for (int d = 0; d < D; ++d) w.vt[static_cast<std::size_t>(d) * T + t] = v[d];
    }
    k::matmul_forward(w.s.data(), w.q.data(), w.k.data(), nullptr, T, D, T);  // S (T, T) = Q K^T
    float* row_lse = lse + (static_cast<std::size_t>(b) * heads + h) * T;
    for (int t = 0; t < T; ++t) {  // P = causal softmax(scale S), row by row
      const float* s = w.s.data() + static_cast<std::size_t>(t) * T;
      float* p = w.p.data() + static_cast<std::size_t>(t) * T;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int t2 = 0; t2 <= t; ++t2) max_score = std::max(max_score, scale * s[t2]);
      float sum = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        p[t2] = std::exp(scale * s[t2] - max_score);
        sum += p[t2];
      }
      const float inv_sum = 1.0f / sum;
      for (int t2 = 0; t2 <= t; ++t2) p[t2] *= inv_sum;
      std::fill(p + t + 1, p + T, 0.0f);
      row_lse[t] = max_score + std::log(sum);
    }
    k::matmul_forward(w.dq.data(), w.p.data(), w.vt.data(), nullptr, T, T, D);  // O (T, D) = P V
    for (int t = 0; t < T; ++t) {
      const float* o = w.dq.data() + static_cast<std::size_t>(t) * D;
      std::copy(o, o + D, out + x.out_index(b, t, h));
    }
  });
}

void attention_backward_gemm(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                             int heads, int head_dim, ThreadPool* pool) {
  check(batch > 0 && seq > 0 && heads > 0 && head_dim > 0, "positive sizes");
  check(dqkv != nullptr && dout != nullptr && qkv != nullptr && lse != nullptr, "non-null buffers");
  check(dqkv != dout && dqkv != qkv, "dqkv aliases neither dout nor qkv");
  const Layout x{batch, seq, heads, head_dim};
  const int T = seq, D = head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for_each_head(x, pool, [&](int b, int h) {
    Scratch& w = scratch();
    const std::size_t td = static_cast<std::size_t>(T) * D;
    w.resize(td, static_cast<std::size_t>(T) * T);
    for (int t = 0; t < T; ++t) {  // Q, K, V, dO (T, D) and K^T (D, T)
      const float* q = qkv + x.qkv_index(b, t, 0, h);
      const float* kk = qkv + x.qkv_index(b, t, 1, h);
      const float* v = qkv + x.qkv_index(b, t, 2, h);
      const float* dy = dout + x.out_index(b, t, h);
      const std::size_t row = static_cast<std::size_t>(t) * D;
      std::copy(q, q + D, w.q.data() + row);
      std::copy(kk, kk + D, w.k.data() + row);
      std::copy(v, v + D, w.v.data() + row);
      std::copy(dy, dy + D, w.d_out.data() + row);
      for (int d = 0; d < D; ++d) w.kt[static_cast<std::size_t>(d) * T + t] = kk[d];
    }
    k::matmul_forward(w.s.data(), w.q.data(), w.k.data(), nullptr, T, D, T);       // S = Q K^T
    k::matmul_forward(w.dp.data(), w.d_out.data(), w.v.data(), nullptr, T, D, T);  // dP = dO V^T
    const float* row_lse = lse + (static_cast<std::size_t>(b) * heads + h) * T;
    for (int t = 0; t < T; ++t) {  // P from the saved lse, then dS in place of S
      float* s = w.s.data() + static_cast<std::size_t>(t) * T;
      float* p = w.p.data() + static_cast<std::size_t>(t) * T;
      const float* dp = w.dp.data() + static_cast<std::size_t>(t) * T;
      float p_dp = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        p[t2] = std::exp(scale * s[t2] - row_lse[t]);
        p_dp += p[t2] * dp[t2];
      }
      for (int t2 = 0; t2 <= t; ++t2) s[t2] = scale * p[t2] * (dp[t2] - p_dp);
      std::fill(p + t + 1, p + T, 0.0f);
      std::fill(s + t + 1, s + T, 0.0f);
    }
    const float* ds = w.s.data();
    k::matmul_forward(w.dq.data(), ds, w.kt.data(), nullptr, T, T, D);  // dQ = dS K
    std::fill(w.dk.begin(), w.dk.begin() + static_cast<std::ptrdiff_t>(td), 0.0f);
    std::fill(w.dv.begin(), w.dv.begin() + static_cast<std::ptrdiff_t>(td), 0.0f);
    add_a_transpose_b(w.dk.data(), ds, w.q.data(), T, T, D);              // dK = dS^T Q
    add_a_transpose_b(w.dv.data(), w.p.data(), w.d_out.data(), T, T, D);  // dV = P^T dO
    for (int t = 0; t < T; ++t) {
      const std::size_t row = static_cast<std::size_t>(t) * D;
      std::copy(w.dq.data() + row, w.dq.data() + row + D, dqkv + x.qkv_index(b, t, 0, h));
      std::copy(w.dk.data() + row, w.dk.data() + row + D, dqkv + x.qkv_index(b, t, 1, h));
      std::copy(w.dv.data() + row, w.dv.data() + row + D, dqkv + x.qkv_index(b, t, 2, h));
    }
  });
}

}  // namespace twin::exec::cpu

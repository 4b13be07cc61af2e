// The plain scalar causal attention, in double: the reference the GEMM kernels of kernels/cpu/attention.hpp are
// checked against (same layouts: qkv (B, T, 3, H, D), out (B, T, H, D), lse (B, H, T)). One query row at a time, its
// keys t2 <= t only, exactly as the formulas read; the backward recomputes the probabilities from the saved lse.
// slopes: the ALiBi slope m_h of each of the H heads (nullptr: none), adding m_h (t2 - t) to the scaled score.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace twin::kernels::cpu::testing {

struct AttentionReference {
  std::vector<double> out;  // (B, T, H*D)
  std::vector<double> lse;  // (B, H, T)
};

// element d of q (which = 0), k (1) or v (2) of head h at (b, t) in a (B, T, 3, H, D) tensor
inline std::size_t qkv_index(int b, int t, int which, int h, int d, int T, int H, int D) {
  return ((static_cast<std::size_t>(b) * T + t) * 3 + which) * H * D + static_cast<std::size_t>(h) * D + d;
}
// element d of head h at (b, t) in a (B, T, H, D) tensor
inline std::size_t out_index(int b, int t, int h, int d, int T, int H, int D) {
  return (static_cast<std::size_t>(b) * T + t) * H * D + static_cast<std::size_t>(h) * D + d;
}

// m_h (t2 - t): the ALiBi bias of head h's score (t, t2), 0 without slopes
inline double alibi_bias(const std::vector<double>* slopes, int h, int t, int t2) {
  return slopes == nullptr ? 0.0 : (*slopes)[static_cast<std::size_t>(h)] * (t2 - t);
}

// s[t2] = q_t . k_t2 / sqrt(D) + m_h (t2 - t) for t2 <= t;  out_t = sum_t2 softmax(s)[t2] v_t2;
// lse_t = log sum_t2 exp(s[t2])
inline AttentionReference attention_forward_reference(const std::vector<double>& qkv, int B, int T, int H, int D,
                                                      const std::vector<double>* slopes = nullptr) {
  AttentionReference ref{std::vector<double>(static_cast<std::size_t>(B) * T * H * D),
                         std::vector<double>(static_cast<std::size_t>(B) * H * T)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> scores(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < T; ++t) {
        double max_score = -std::numeric_limits<double>::infinity();
        for (int t2 = 0; t2 <= t; ++t2) {
          double s = 0.0;
          for (int d = 0; d < D; ++d)
            s += qkv[qkv_index(b, t, 0, h, d, T, H, D)] * qkv[qkv_index(b, t2, 1, h, d, T, H, D)];
          scores[t2] = scale * s + alibi_bias(slopes, h, t, t2);
          max_score = std::max(max_score, scores[t2]);
        }
        double sum = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(scores[t2] - max_score);
        for (int d = 0; d < D; ++d) {
          double o = 0.0;
          for (int t2 = 0; t2 <= t; ++t2) {
            o += std::exp(scores[t2] - max_score) / sum * qkv[qkv_index(b, t2, 2, h, d, T, H, D)];
          }
          ref.out[out_index(b, t, h, d, T, H, D)] = o;
        }
        ref.lse[(static_cast<std::size_t>(b) * H + h) * T + t] = max_score + std::log(sum);
      }
    }
  }
  return ref;
}

// dqkv (B, T, 3*H*D) for the upstream gradient dout (B, T, H*D), from the reference forward's lse (same slopes):
//   p = exp(s - lse);  dp[t2] = dout_t . v_t2;  dv_t2 += p dout_t;  ds = p (dp - sum_t2 p dp);
//   dq_t += ds k_t2 / sqrt(D);  dk_t2 += ds q_t / sqrt(D)   (the ALiBi bias is a constant: no term of its own)
inline std::vector<double> attention_backward_reference(const std::vector<double>& dout, const std::vector<double>& qkv,
                                                        int B, int T, int H, int D,
                                                        const std::vector<double>* slopes = nullptr) {
  const std::vector<double> lse = attention_forward_reference(qkv, B, T, H, D, slopes).lse;
  std::vector<double> dqkv(qkv.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> probs(static_cast<std::size_t>(T)), dprobs(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < T; ++t) {
        const double row_lse = lse[(static_cast<std::size_t>(b) * H + h) * T + t];
        double p_dp = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double s = 0.0, dp = 0.0;
          for (int d = 0; d < D; ++d) {
            s += qkv[qkv_index(b, t, 0, h, d, T, H, D)] * qkv[qkv_index(b, t2, 1, h, d, T, H, D)];
            dp += dout[out_index(b, t, h, d, T, H, D)] * qkv[qkv_index(b, t2, 2, h, d, T, H, D)];
          }
          probs[t2] = std::exp(scale * s + alibi_bias(slopes, h, t, t2) - row_lse);
          dprobs[t2] = dp;
          p_dp += probs[t2] * dp;
          for (int d = 0; d < D; ++d)
            dqkv[qkv_index(b, t2, 2, h, d, T, H, D)] += probs[t2] * dout[out_index(b, t, h, d, T, H, D)];
        }
        for (int t2 = 0; t2 <= t; ++t2) {
          const double dscore = scale * probs[t2] * (dprobs[t2] - p_dp);
          for (int d = 0; d < D; ++d) {
            dqkv[qkv_index(b, t, 0, h, d, T, H, D)] += dscore * qkv[qkv_index(b, t2, 1, h, d, T, H, D)];
            dqkv[qkv_index(b, t2, 1, h, d, T, H, D)] += dscore * qkv[qkv_index(b, t, 0, h, d, T, H, D)];
          }
        }
      }
    }
  }
  return dqkv;
}

}  // namespace twin::kernels::cpu::testing

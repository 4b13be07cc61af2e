// Causal multi-head attention against a naive double loop, the causal mask, and central finite differences.
#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

struct AttentionReference {
  std::vector<double> out;  // (B, T, H*D)
  std::vector<double> lse;  // (B, H, T)
};

// The textbook form: the full (T, T) score matrix with -inf above the diagonal, softmax, times V.
AttentionReference attention_reference(const std::vector<double>& qkv, int B, int T, int H, int D) {
  const int hidden = H * D;
  AttentionReference ref{std::vector<double>(static_cast<std::size_t>(B) * T * hidden),
                         std::vector<double>(static_cast<std::size_t>(B) * H * T)};
  auto at = [&](int b, int t, int which, int h, int d) { return qkv[((b * T + t) * 3 + which) * hidden + h * D + d]; };
  std::vector<double> scores(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < T; ++t) {
        double max_score = -std::numeric_limits<double>::infinity();
        for (int t2 = 0; t2 < T; ++t2) {
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += at(b, t, 0, h, d) * at(b, t2, 1, h, d);
          scores[t2] = t2 <= t ? s / std::sqrt(double(D)) : -std::numeric_limits<double>::infinity();
          max_score = std::max(max_score, scores[t2]);
        }
        double sum = 0.0;
        for (int t2 = 0; t2 < T; ++t2) sum += std::exp(scores[t2] - max_score);
        for (int d = 0; d < D; ++d) {
          double o = 0.0;
          for (int t2 = 0; t2 < T; ++t2) o += std::exp(scores[t2] - max_score) / sum * at(b, t2, 2, h, d);
          ref.out[(b * T + t) * hidden + h * D + d] = o;
        }
        ref.lse[(b * H + h) * T + t] = max_score + std::log(sum);
      }
    }
  }
  return ref;
}

TEST(CpuAttention, ForwardMatchesNaiveDoubleLoop) {
  const int B = 2, T = 13, H = 3, D = 8;
  const auto qkv = random_vector(B * T * 3 * H * D, 1, -2.0f, 2.0f);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  const auto ref = attention_reference(to_double(qkv), B, T, H, D);
  EXPECT_TRUE(all_close(out, ref.out, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(lse, ref.lse, 1e-5, 1e-5));
}

TEST(CpuAttention, FirstPositionCopiesItsValue) {
  const int B = 1, T = 4, H = 2, D = 3;
  const auto qkv = random_vector(B * T * 3 * H * D, 2);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  for (int i = 0; i < H * D; ++i) EXPECT_FLOAT_EQ(out[i], qkv[2 * H * D + i]);  // t = 0 attends only to itself
}

TEST(CpuAttention, CausalMaskIgnoresLaterPositions) {
  const int B = 2, T = 10, H = 2, D = 4, hidden = H * D;
  const auto qkv = random_vector(B * T * 3 * hidden, 3);
  std::vector<float> out(B * T * hidden), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  // change q, k and v of positions >= cut: outputs before cut keep their bits, the outputs at cut change
  const int cut = 6;
  auto changed = qkv;
  for (int b = 0; b < B; ++b)
    for (int t = cut; t < T; ++t)
      for (int i = 0; i < 3 * hidden; ++i) changed[(b * T + t) * 3 * hidden + i] += 0.5f;
  std::vector<float> out2(out.size()), lse2(lse.size());
  attention_forward(out2.data(), lse2.data(), changed.data(), B, T, H, D);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < hidden; ++i) {
        const std::size_t index = (b * T + t) * hidden + i;
        if (t < cut) {
          EXPECT_EQ(out[index], out2[index]) << "b " << b << " t " << t;
        } else {
          EXPECT_NE(out[index], out2[index]) << "b " << b << " t " << t;
        }
      }
    }
  }
}

TEST(CpuAttention, BackwardMatchesFiniteDifferencesAndOverwrites) {
  const int B = 2, T = 5, H = 2, D = 4;
  const auto qkv = random_vector(B * T * 3 * H * D, 11);
  const auto dout = random_vector(B * T * H * D, 12);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  std::vector<float> dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, D);
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) { return weighted_sum(attention_reference(v, B, T, H, D).out, dout); },
      to_double(qkv));
  EXPECT_TRUE(all_close(dqkv, want, 1e-5, 1e-4));
}

TEST(CpuAttention, BackwardAtLargerShape) {  // more positions than the finite-difference test, against itself in double
  const int B = 1, T = 24, H = 2, D = 16;
  const auto qkv = random_vector(B * T * 3 * H * D, 21, -1.5f, 1.5f);
  const auto dout = random_vector(B * T * H * D, 22);
  std::vector<float> out(B * T * H * D), lse(B * H * T), dqkv(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, D);
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) { return weighted_sum(attention_reference(v, B, T, H, D).out, dout); },
      to_double(qkv), 1e-5);
  EXPECT_TRUE(all_close(dqkv, want, 1e-4, 1e-3));
}

TEST(CpuAttention, IsDeterministic) {
  const int B = 2, T = 32, H = 4, D = 16;
  const auto qkv = random_vector(B * T * 3 * H * D, 31);
  const auto dout = random_vector(B * T * H * D, 32);
  std::vector<float> results[2];
  for (auto& result : results) {
    std::vector<float> out(B * T * H * D), lse(B * H * T), dqkv(qkv.size());
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, D);
    for (const auto* part : {&out, &lse, &dqkv}) result.insert(result.end(), part->begin(), part->end());
  }
  EXPECT_TRUE(testing::same_bits(results[0], results[1]));
}

}  // namespace
}  // namespace twin::kernels::cpu

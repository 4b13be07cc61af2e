// Causal multi-head attention (GEMMs over blocks of query rows) against the plain scalar loops in double
// (attention_reference.hpp), the causal mask, and central finite differences. Shapes with seq above the kernel's
// block of 64 rows cover the blocks above the diagonal (skipped), the diagonal blocks and a ragged last block.
#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention_reference.hpp"
#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::attention_backward_reference;
using testing::attention_forward_reference;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

struct Shape {
  int B, T, H, D;
  std::size_t qkv() const { return static_cast<std::size_t>(B) * T * 3 * H * D; }
  std::size_t out() const { return static_cast<std::size_t>(B) * T * H * D; }
  std::size_t lse() const { return static_cast<std::size_t>(B) * H * T; }
};

// The kernels' out, lse and dqkv against the reference's, qkv uniform in [-range, range).
void expect_matches_reference(Shape x, float range, double atol, double rtol) {
  const auto qkv = random_vector(x.qkv(), 41, -range, range);
  const auto dout = random_vector(x.out(), 42);
  std::vector<float> out(x.out()), lse(x.lse());
  std::vector<float> dqkv(x.qkv(), std::numeric_limits<float>::quiet_NaN());  // the backward overwrites
  attention_forward(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.D);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.D);
  const auto ref = attention_forward_reference(to_double(qkv), x.B, x.T, x.H, x.D);
  EXPECT_TRUE(all_close(out, ref.out, atol, rtol));
  EXPECT_TRUE(all_close(lse, ref.lse, atol, rtol));
  EXPECT_TRUE(
      all_close(dqkv, attention_backward_reference(to_double(dout), to_double(qkv), x.B, x.T, x.H, x.D), atol, rtol));
}

TEST(CpuAttention, ForwardMatchesNaiveDoubleLoop) {
  const int B = 2, T = 13, H = 3, D = 8;
  const auto qkv = random_vector(B * T * 3 * H * D, 1, -2.0f, 2.0f);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  const auto ref = attention_forward_reference(to_double(qkv), B, T, H, D);
  EXPECT_TRUE(all_close(out, ref.out, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(lse, ref.lse, 1e-5, 1e-5));
}

TEST(CpuAttention, MatchesReferenceAcrossQueryBlocks) {
  expect_matches_reference({2, 150, 2, 16}, 1.0f, 1e-5, 1e-4);  // blocks of 64, 64 and 22 rows
  expect_matches_reference({1, 128, 3, 8}, 1.0f, 1e-5, 1e-4);   // seq a multiple of the block
  expect_matches_reference({1, 65, 1, 64}, 1.0f, 1e-5, 1e-4);   // a last block of one row
}

TEST(CpuAttention, MatchesReferenceWithLargeScores) {
  // scores up to ~100: most probabilities underflow (exp below -87 is 0) and every row's softmax is peaked
  expect_matches_reference({1, 96, 2, 16}, 5.0f, 1e-4, 1e-4);
}

TEST(CpuAttention, OneTokenOneHead) {
  const auto qkv = random_vector(3 * 4, 5);  // q, k, v of one token, head_dim 4
  const auto dout = random_vector(4, 6);
  std::vector<float> out(4), lse(1), dqkv(qkv.size(), 123.0f);
  attention_forward(out.data(), lse.data(), qkv.data(), 1, 1, 1, 4);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), 1, 1, 1, 4);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(out[d], qkv[8 + d]);    // the only probability is 1
    EXPECT_EQ(dqkv[d], 0.0f);         // dq: the score does not move a softmax of one
    EXPECT_EQ(dqkv[4 + d], 0.0f);     // dk
    EXPECT_EQ(dqkv[8 + d], dout[d]);  // dv = p dout
  }
  EXPECT_NEAR(lse[0], (qkv[0] * qkv[4] + qkv[1] * qkv[5] + qkv[2] * qkv[6] + qkv[3] * qkv[7]) / 2.0f, 1e-6);
}

TEST(CpuAttention, FirstPositionCopiesItsValue) {
  const int B = 1, T = 4, H = 2, D = 3;
  const auto qkv = random_vector(B * T * 3 * H * D, 2);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  for (int i = 0; i < H * D; ++i) EXPECT_FLOAT_EQ(out[i], qkv[2 * H * D + i]);  // t = 0 attends only to itself
}

TEST(CpuAttention, CausalMaskIgnoresLaterPositions) {
  // cut inside the second block of 64 rows: the rows above it in that block see the changed keys in their GEMM and
  // must still give the same bits (masked probabilities are exact zeros)
  const int B = 2, T = 150, H = 2, D = 4, hidden = H * D;
  const auto qkv = random_vector(B * T * 3 * hidden, 3);
  std::vector<float> out(B * T * hidden), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D);
  // change q, k and v of positions >= cut: outputs before cut keep their bits, the outputs at cut change
  const int cut = 100;
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

TEST(CpuAttention, ReferenceBackwardMatchesFiniteDifferences) {  // the reference itself, before it judges the kernel
  const int B = 1, T = 6, H = 2, D = 3;
  const auto qkv = to_double(random_vector(B * T * 3 * H * D, 13));
  const auto dout = random_vector(B * T * H * D, 14);
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) { return weighted_sum(attention_forward_reference(v, B, T, H, D).out, dout); },
      qkv);
  EXPECT_TRUE(all_close(attention_backward_reference(to_double(dout), qkv, B, T, H, D), want, 1e-8, 1e-6));
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
      [&](const std::vector<double>& v) { return weighted_sum(attention_forward_reference(v, B, T, H, D).out, dout); },
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
      [&](const std::vector<double>& v) { return weighted_sum(attention_forward_reference(v, B, T, H, D).out, dout); },
      to_double(qkv), 1e-5);
  EXPECT_TRUE(all_close(dqkv, want, 1e-4, 1e-3));
}

TEST(CpuAttention, IsDeterministic) {
  const int B = 2, T = 100, H = 4, D = 16;
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

TEST(CpuAttention, BatchElementsAreIndependent) {  // the CPU backend splits the batch over threads: same bits
  const Shape x{3, 70, 2, 8};
  const auto qkv = random_vector(x.qkv(), 51);
  const auto dout = random_vector(x.out(), 52);
  std::vector<float> out(x.out()), lse(x.lse()), dqkv(x.qkv());
  attention_forward(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.D);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.D);
  const Shape one{1, x.T, x.H, x.D};
  for (int b = 0; b < x.B; ++b) {
    std::vector<float> out1(one.out()), lse1(one.lse()), dqkv1(one.qkv());
    attention_forward(out1.data(), lse1.data(), qkv.data() + b * one.qkv(), 1, x.T, x.H, x.D);
    attention_backward(dqkv1.data(), dout.data() + b * one.out(), qkv.data() + b * one.qkv(), lse1.data(), 1, x.T, x.H,
                       x.D);
    EXPECT_TRUE(testing::same_bits(out1, {out.begin() + b * one.out(), out.begin() + (b + 1) * one.out()}));
    EXPECT_TRUE(testing::same_bits(lse1, {lse.begin() + b * one.lse(), lse.begin() + (b + 1) * one.lse()}));
    EXPECT_TRUE(testing::same_bits(dqkv1, {dqkv.begin() + b * one.qkv(), dqkv.begin() + (b + 1) * one.qkv()}));
  }
}

TEST(CpuAttention, RejectsBadArguments) {
  std::vector<float> qkv(3 * 4), out(4), lse(1), dqkv(3 * 4);
  EXPECT_THROW(attention_forward(out.data(), lse.data(), qkv.data(), 1, 0, 1, 4), std::invalid_argument);
  EXPECT_THROW(attention_forward(qkv.data(), lse.data(), qkv.data(), 1, 1, 1, 4), std::invalid_argument);
  EXPECT_THROW(attention_backward(qkv.data(), out.data(), qkv.data(), lse.data(), 1, 1, 1, 4), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

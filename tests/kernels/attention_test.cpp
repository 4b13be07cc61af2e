// Causal multi-head attention (GEMMs over blocks of query rows) against the plain scalar loops in double
// (attention_reference.hpp), the causal mask, and central finite differences. Shapes with seq above the kernel's
// block of 64 rows cover the blocks above the diagonal (skipped), the diagonal blocks and a ragged last block.
// CpuAlibi: the ALiBi slopes against their definition written out again, the biased kernels against the biased
// reference, and the properties the executor relies on (a tensor-parallel rank's heads, nullptr = no bias).
#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

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

// The kernels' out, lse and dqkv against the reference's, qkv uniform in [-range, range); with ALiBi when `slopes`
// (x.H of them) is given.
void expect_matches_reference(Shape x, float range, double atol, double rtol,
                              const std::vector<float>* slopes = nullptr) {
  const auto qkv = random_vector(x.qkv(), 41, -range, range);
  const auto dout = random_vector(x.out(), 42);
  const float* kernel_slopes = slopes != nullptr ? slopes->data() : nullptr;
  const std::vector<double> slopes_double = slopes != nullptr ? to_double(*slopes) : std::vector<double>{};
  const std::vector<double>* ref_slopes = slopes != nullptr ? &slopes_double : nullptr;
  std::vector<float> out(x.out()), lse(x.lse());
  std::vector<float> dqkv(x.qkv(), std::numeric_limits<float>::quiet_NaN());  // the backward overwrites
  attention_forward(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.D, kernel_slopes);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.D, kernel_slopes);
  const auto ref = attention_forward_reference(to_double(qkv), x.B, x.T, x.H, x.D, ref_slopes);
  EXPECT_TRUE(all_close(out, ref.out, atol, rtol));
  EXPECT_TRUE(all_close(lse, ref.lse, atol, rtol));
  EXPECT_TRUE(all_close(
      dqkv, attention_backward_reference(to_double(dout), to_double(qkv), x.B, x.T, x.H, x.D, ref_slopes), atol, rtol));
}

// out, lse and dqkv of one forward and backward, concatenated: what the bitwise comparisons compare
std::vector<float> forward_backward(const std::vector<float>& qkv, const std::vector<float>& dout, Shape x,
                                    const float* slopes) {
  std::vector<float> out(x.out()), lse(x.lse()), dqkv(x.qkv());
  attention_forward(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.D, slopes);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.D, slopes);
  std::vector<float> result;
  for (const auto* part : {&out, &lse, &dqkv}) result.insert(result.end(), part->begin(), part->end());
  return result;
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

// --- ALiBi ----------------------------------------------------------------------------------------------------------

// BigScience's get_slopes (Megatron-DeepSpeed, megatron/model/transformer.py) as it reads, in double, recursion and
// all: the definition alibi_slopes is checked against.
std::vector<double> get_slopes(int n) {
  const auto power_of_2 = [](int p) {
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(p)) - 3.0)));
    std::vector<double> slopes;
    for (int i = 0; i < p; ++i) slopes.push_back(start * std::pow(start, i));
    return slopes;
  };
  const double log2n = std::log2(static_cast<double>(n));
  if (log2n == std::floor(log2n)) return power_of_2(n);
  const int closest = static_cast<int>(std::pow(2.0, std::floor(log2n)));
  std::vector<double> slopes = power_of_2(closest);
  const std::vector<double> doubled = get_slopes(2 * closest);
  for (int i = 0; i < n - closest; ++i) slopes.push_back(doubled[static_cast<std::size_t>(2 * i)]);  // [0::2][:n-c]
  return slopes;
}

TEST(CpuAlibi, SlopesOfPowersOfTwoHeads) {
  // 8 heads: 2^-1 .. 2^-8, exactly (the paper's own example)
  const auto eight = alibi_slopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(eight[i], 1.0f / static_cast<float>(2 << i)) << "head " << i;
  // 16 heads: 2^-0.5, 2^-1, ..., 2^-8: the 8-head slopes at the odd indices, the geometric means between them at the
  // even ones
  const auto sixteen = alibi_slopes(16);
  ASSERT_EQ(sixteen.size(), 16u);
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(sixteen[i], std::exp2(-0.5 * (i + 1))) << "head " << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(sixteen[2 * i + 1], eight[i]) << "head " << 2 * i + 1;
  // one head: start = 2^(-2^-(0 - 3)) = 2^-8, its only slope; two heads: 2^-4, 2^-8; four: 2^-2, ..., 2^-8
  EXPECT_EQ(alibi_slopes(1), std::vector<float>{1.0f / 256});
  EXPECT_EQ(alibi_slopes(2), (std::vector<float>{1.0f / 16, 1.0f / 256}));
  EXPECT_EQ(alibi_slopes(4), (std::vector<float>{1.0f / 4, 1.0f / 16, 1.0f / 64, 1.0f / 256}));
}

TEST(CpuAlibi, SlopesOfOtherHeadCounts) {
  // 12 heads: the 8 slopes of 8 heads, then slopes 0, 2, 4, 6 of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
  const auto twelve = alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  const auto eight = alibi_slopes(8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(twelve[i], eight[i]) << "head " << i;
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(twelve[8 + i], std::exp2(-0.5 - i)) << "head " << 8 + i;
  // against the definition as BigScience wrote it, among them 112 (BLOOM-176B's heads) and 3 (the two slopes of 2
  // heads, then slope 0 of 4)
  for (int n : {1, 2, 3, 5, 6, 7, 12, 16, 20, 24, 25, 32, 40, 48, 64, 96, 112, 128}) {
    const auto got = alibi_slopes(n);
    const auto want = get_slopes(n);
    ASSERT_EQ(got.size(), want.size()) << n << " heads";
    for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(got[i], static_cast<float>(want[i])) << n << " heads, head " << i;
  }
}

TEST(CpuAlibi, SlopesRejectNoHeads) {
  EXPECT_THROW(alibi_slopes(0), std::invalid_argument);
  EXPECT_THROW(alibi_slopes(-3), std::invalid_argument);
}

TEST(CpuAlibi, RejectsNonFiniteSlopes) {
  std::vector<float> qkv(3 * 2 * 4), out(2 * 4), lse(2), dqkv(qkv.size());
  const std::vector<float> nan_slope{0.5f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<float> inf_slope{std::numeric_limits<float>::infinity(), 0.5f};
  for (const auto* slopes : {&nan_slope, &inf_slope}) {
    EXPECT_THROW(attention_forward(out.data(), lse.data(), qkv.data(), 1, 1, 2, 4, slopes->data()),
                 std::invalid_argument);
    EXPECT_THROW(attention_backward(dqkv.data(), out.data(), qkv.data(), lse.data(), 1, 1, 2, 4, slopes->data()),
                 std::invalid_argument);
  }
}

TEST(CpuAlibi, MatchesReferenceAcrossQueryBlocks) {
  const auto two = alibi_slopes(2);  // 1/16, 1/256: weak biases, over 150 positions up to -9 nats
  expect_matches_reference({2, 150, 2, 16}, 1.0f, 1e-5, 1e-4, &two);
  const std::vector<float> steep{0.5f, 0.25f, 0.125f};  // heads 0..2 of 8: far keys weigh e^-63 and less
  expect_matches_reference({1, 128, 3, 8}, 1.0f, 1e-5, 1e-4, &steep);
  const auto one = alibi_slopes(1);
  expect_matches_reference({1, 65, 1, 64}, 1.0f, 1e-5, 1e-4, &one);
  const auto twelve = alibi_slopes(12);  // a rank's heads [8, 12) of 12: the slopes between those of 8 heads
  const std::vector<float> last_four(twelve.begin() + 8, twelve.end());
  expect_matches_reference({2, 70, 4, 16}, 2.0f, 1e-5, 1e-4, &last_four);
}

TEST(CpuAlibi, ReferenceBackwardMatchesFiniteDifferences) {  // the biased reference itself, before it judges the kernel
  const int B = 1, T = 6, H = 2, D = 3;
  const std::vector<double> slopes{0.5, 0.0625};
  const auto qkv = to_double(random_vector(B * T * 3 * H * D, 13));
  const auto dout = random_vector(B * T * H * D, 14);
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(attention_forward_reference(v, B, T, H, D, &slopes).out, dout);
      },
      qkv);
  EXPECT_TRUE(all_close(attention_backward_reference(to_double(dout), qkv, B, T, H, D, &slopes), want, 1e-8, 1e-6));
}

TEST(CpuAlibi, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 9, H = 2, D = 4;
  const std::vector<float> slopes{0.5f, 0.125f};
  const std::vector<double> slopes_double = to_double(slopes);
  const auto qkv = random_vector(B * T * 3 * H * D, 11);
  const auto dout = random_vector(B * T * H * D, 12);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D, slopes.data());
  std::vector<float> dqkv(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, D, slopes.data());
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(attention_forward_reference(v, B, T, H, D, &slopes_double).out, dout);
      },
      to_double(qkv));
  EXPECT_TRUE(all_close(dqkv, want, 1e-5, 1e-4));
}

TEST(CpuAlibi, LargeSlopeMakesAttentionLocal) {
  // slope 30 on head 0: the key one position back is down by e^-30 against the query's own (scores are within +-4 at
  // D 16), so each query attends to itself alone: out_t = v_t, lse_t = q_t . k_t / 4. Head 1 (slope 0) still mixes.
  const int B = 2, T = 80, H = 2, D = 16;
  const std::vector<float> slopes{30.0f, 0.0f};
  const auto qkv = random_vector(B * T * 3 * H * D, 61);
  std::vector<float> out(B * T * H * D), lse(B * H * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D, slopes.data());
  const auto in = [&](int b, int t, int which, int h, int d) -> double {
    return qkv[testing::qkv_index(b, t, which, h, d, T, H, D)];
  };
  const auto got = [&](int b, int t, int h, int d) -> double { return out[testing::out_index(b, t, h, d, T, H, D)]; };
  double local_error = 0.0, head1_distance = 0.0;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      double qk = 0.0;
      for (int d = 0; d < D; ++d) {
        local_error = std::max(local_error, std::abs(got(b, t, 0, d) - in(b, t, 2, 0, d)));
        if (t > 0) head1_distance = std::max(head1_distance, std::abs(got(b, t, 1, d) - in(b, t, 2, 1, d)));
        qk += in(b, t, 0, 0, d) * in(b, t, 1, 0, d);
      }
      EXPECT_NEAR(lse[(static_cast<std::size_t>(b) * H) * T + t], qk / 4.0, 1e-5) << "b " << b << " t " << t;
    }
  }
  EXPECT_LT(local_error, 1e-6);
  EXPECT_GT(head1_distance, 0.1);  // without the bias the same queries do not copy their own value
}

TEST(CpuAlibi, TensorParallelRankUsesGlobalSlopes) {
  // all H heads with alibi_slopes(H), against rank 1 of tp 2 alone: heads [H/2, H) in a (B, T, 3, H/2, D) tensor with
  // the slopes pointer at H/2. Same bits: the executor's ranks must reproduce the unsplit model. Rank 1's heads given
  // alibi_slopes(H/2), their local numbering, would be a different model.
  const Shape all{2, 150, 4, 8}, half{2, 150, 2, 8};
  const auto slopes = alibi_slopes(all.H);
  const auto qkv = random_vector(all.qkv(), 71);
  const auto dout = random_vector(all.out(), 72);
  std::vector<float> out(all.out()), lse(all.lse()), dqkv(all.qkv());
  attention_forward(out.data(), lse.data(), qkv.data(), all.B, all.T, all.H, all.D, slopes.data());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), all.B, all.T, all.H, all.D, slopes.data());

  // rank 1's slices of qkv (B, T, 3, H, D) -> (B, T, 3, H/2, D) and dout (B, T, H, D) -> (B, T, H/2, D), and the
  // full results' slices to compare with
  std::vector<float> qkv1(half.qkv()), dout1(half.out()), want_out(half.out()), want_lse(half.lse()),
      want_dqkv(half.qkv());
  for (int b = 0; b < all.B; ++b) {
    for (int t = 0; t < all.T; ++t) {
      for (int h = 0; h < half.H; ++h) {
        for (int d = 0; d < all.D; ++d) {
          for (int which = 0; which < 3; ++which) {
            const auto from = testing::qkv_index(b, t, which, half.H + h, d, all.T, all.H, all.D);
            const auto to = testing::qkv_index(b, t, which, h, d, half.T, half.H, half.D);
            qkv1[to] = qkv[from];
            want_dqkv[to] = dqkv[from];
          }
          const auto from = testing::out_index(b, t, half.H + h, d, all.T, all.H, all.D);
          const auto to = testing::out_index(b, t, h, d, half.T, half.H, half.D);
          dout1[to] = dout[from];
          want_out[to] = out[from];
        }
        want_lse[(static_cast<std::size_t>(b) * half.H + h) * half.T + t] =
            lse[(static_cast<std::size_t>(b) * all.H + half.H + h) * all.T + t];
      }
    }
  }
  std::vector<float> out1(half.out()), lse1(half.lse()), dqkv1(half.qkv());
  const float* rank_slopes = slopes.data() + half.H;
  attention_forward(out1.data(), lse1.data(), qkv1.data(), half.B, half.T, half.H, half.D, rank_slopes);
  attention_backward(dqkv1.data(), dout1.data(), qkv1.data(), lse1.data(), half.B, half.T, half.H, half.D, rank_slopes);
  EXPECT_TRUE(testing::same_bits(out1, want_out));
  EXPECT_TRUE(testing::same_bits(lse1, want_lse));
  EXPECT_TRUE(testing::same_bits(dqkv1, want_dqkv));

  const auto local = alibi_slopes(half.H);  // the mistake this guards against
  attention_forward(out1.data(), lse1.data(), qkv1.data(), half.B, half.T, half.H, half.D, local.data());
  EXPECT_FALSE(all_close(out1, want_out, 1e-3, 1e-3));
}

TEST(CpuAlibi, ZeroSlopesKeepTheBitsOfNoAlibi) {
  // nullptr is the kernels without ALiBi (the existing tests above); slopes of 0 must give those very bits, forward
  // and backward, across query blocks: the bias is folded in without another rounding of the scores
  const Shape x{2, 150, 3, 16};
  const auto qkv = random_vector(x.qkv(), 81, -2.0f, 2.0f);
  const auto dout = random_vector(x.out(), 82);
  const std::vector<float> zeros(static_cast<std::size_t>(x.H), 0.0f);
  const auto without = forward_backward(qkv, dout, x, nullptr);
  EXPECT_TRUE(testing::same_bits(forward_backward(qkv, dout, x, zeros.data()), without));
  // and a slope that is not zero does move them (the comparison can fail)
  const std::vector<float> small{0.0f, 1.0f / 1024, 0.0f};
  EXPECT_FALSE(testing::same_bits(forward_backward(qkv, dout, x, small.data()), without));
}

TEST(CpuAlibi, IsDeterministicAndBatchElementsAreIndependent) {  // the CPU backend splits the batch over threads
  const Shape x{3, 70, 2, 8}, one{1, 70, 2, 8};
  const auto slopes = alibi_slopes(x.H);
  const auto qkv = random_vector(x.qkv(), 91);
  const auto dout = random_vector(x.out(), 92);
  EXPECT_TRUE(
      testing::same_bits(forward_backward(qkv, dout, x, slopes.data()), forward_backward(qkv, dout, x, slopes.data())));
  std::vector<float> out(x.out()), lse(x.lse());
  attention_forward(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.D, slopes.data());
  for (int b = 0; b < x.B; ++b) {
    std::vector<float> out1(one.out()), lse1(one.lse());
    attention_forward(out1.data(), lse1.data(), qkv.data() + b * one.qkv(), 1, x.T, x.H, x.D, slopes.data());
    EXPECT_TRUE(testing::same_bits(out1, {out.begin() + b * one.out(), out.begin() + (b + 1) * one.out()}));
    EXPECT_TRUE(testing::same_bits(lse1, {lse.begin() + b * one.lse(), lse.begin() + (b + 1) * one.lse()}));
  }
}

}  // namespace
}  // namespace twin::kernels::cpu

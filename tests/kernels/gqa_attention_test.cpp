// Grouped-query attention (attention_forward_gqa / attention_backward_gqa) against multi-head attention run on the
// same queries with each kv head's k and v repeated for every query head of its group: the same outputs, the same
// dq, and dk, dv the sums over each group of multi-head attention's. With kv_heads == heads the new kernels must give
// the very bits of attention_forward / attention_backward (which the executor calls).
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/attention.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::attention_forward_reference;
using testing::numeric_gradient;
using testing::random_vector;
using testing::same_bits;
using testing::to_double;
using testing::weighted_sum;

struct GqaShape {
  int B, T, H, KV, D;
  int group() const { return H / KV; }
  std::size_t qkv() const { return static_cast<std::size_t>(B) * T * (H + 2 * KV) * D; }
  std::size_t mha_qkv() const { return static_cast<std::size_t>(B) * T * 3 * H * D; }
  std::size_t out() const { return static_cast<std::size_t>(B) * T * H * D; }
  std::size_t lse() const { return static_cast<std::size_t>(B) * H * T; }
  // element d of q (which = 0, head < H), k (1, head < KV) or v (2, head < KV) of token (b, t) in the GQA layout
  std::size_t at(int b, int t, int which, int head, int d) const {
    const int first = which == 0 ? 0 : which == 1 ? H : H + KV;
    return (static_cast<std::size_t>(b) * T + t) * (H + 2 * KV) * D + static_cast<std::size_t>(first + head) * D + d;
  }
};

// the MHA tensor (B, T, 3, H, D): q as it is, k and v of query head h those of kv head h / group
template <class Value>
std::vector<Value> repeat_kv(const std::vector<Value>& qkv, const GqaShape& x) {
  std::vector<Value> mha(x.mha_qkv());
  for (int b = 0; b < x.B; ++b)
    for (int t = 0; t < x.T; ++t)
      for (int h = 0; h < x.H; ++h)
        for (int d = 0; d < x.D; ++d) {
          mha[testing::qkv_index(b, t, 0, h, d, x.T, x.H, x.D)] = qkv[x.at(b, t, 0, h, d)];
          mha[testing::qkv_index(b, t, 1, h, d, x.T, x.H, x.D)] = qkv[x.at(b, t, 1, h / x.group(), d)];
          mha[testing::qkv_index(b, t, 2, h, d, x.T, x.H, x.D)] = qkv[x.at(b, t, 2, h / x.group(), d)];
        }
  return mha;
}

// the GQA gradient from MHA's on the repeated tensor: dq as it is, dk and dv of kv head g summed over g's query heads
// (in double)
std::vector<double> sum_groups(const std::vector<float>& mha_dqkv, const GqaShape& x) {
  std::vector<double> dqkv(x.qkv(), 0.0);
  for (int b = 0; b < x.B; ++b)
    for (int t = 0; t < x.T; ++t)
      for (int h = 0; h < x.H; ++h)
        for (int d = 0; d < x.D; ++d) {
          dqkv[x.at(b, t, 0, h, d)] = mha_dqkv[testing::qkv_index(b, t, 0, h, d, x.T, x.H, x.D)];
          dqkv[x.at(b, t, 1, h / x.group(), d)] += mha_dqkv[testing::qkv_index(b, t, 1, h, d, x.T, x.H, x.D)];
          dqkv[x.at(b, t, 2, h / x.group(), d)] += mha_dqkv[testing::qkv_index(b, t, 2, h, d, x.T, x.H, x.D)];
        }
  return dqkv;
}

// GQA forward and backward against MHA on the repeated k, v, with ALiBi when `slopes` (x.H of them) is given
void expect_gqa_matches_repeated_mha(const GqaShape& x, const float* slopes) {
  const auto qkv = random_vector(x.qkv(), 41, -1.5f, 1.5f);
  const auto dout = random_vector(x.out(), 42);
  std::vector<float> out(x.out()), lse(x.lse());
  std::vector<float> dqkv(x.qkv(), std::numeric_limits<float>::quiet_NaN());  // overwritten as a whole
  attention_forward_gqa(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.KV, x.D, slopes);
  attention_backward_gqa(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.KV, x.D, slopes);

  const auto mha_qkv = repeat_kv(qkv, x);
  std::vector<float> mha_out(x.out()), mha_lse(x.lse()), mha_dqkv(x.mha_qkv());
  attention_forward(mha_out.data(), mha_lse.data(), mha_qkv.data(), x.B, x.T, x.H, x.D, slopes);
  attention_backward(mha_dqkv.data(), dout.data(), mha_qkv.data(), mha_lse.data(), x.B, x.T, x.H, x.D, slopes);

  EXPECT_TRUE(all_close(out, mha_out, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(lse, mha_lse, 1e-6, 1e-6));
  // dq alone (the sums' rounding apart), and the whole of dqkv with the group sums of dk and dv
  const auto want = sum_groups(mha_dqkv, x);
  std::vector<float> dq_got;
  std::vector<double> dq_want;
  for (int b = 0; b < x.B; ++b)
    for (int t = 0; t < x.T; ++t)
      for (int i = 0; i < x.H * x.D; ++i) {
        dq_got.push_back(dqkv[x.at(b, t, 0, 0, i)]);
        dq_want.push_back(want[x.at(b, t, 0, 0, i)]);
      }
  EXPECT_TRUE(all_close(dq_got, dq_want, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(dqkv, want, 1e-5, 1e-5));
}

TEST(CpuGqaAttention, MatchesMhaWithRepeatedKv) {
  // two and four query heads per kv head (kv_heads 1: multi-query attention); seq 150 crosses blocks of 64 rows
  expect_gqa_matches_repeated_mha({2, 150, 4, 2, 16}, nullptr);
  expect_gqa_matches_repeated_mha({2, 150, 4, 1, 16}, nullptr);
  expect_gqa_matches_repeated_mha({1, 13, 6, 3, 8}, nullptr);
}

TEST(CpuGqaAttention, MatchesMhaWithRepeatedKvUnderAlibi) {
  const auto slopes = alibi_slopes(4);  // one slope per QUERY head
  expect_gqa_matches_repeated_mha({2, 100, 4, 2, 16}, slopes.data());
  expect_gqa_matches_repeated_mha({1, 70, 4, 1, 8}, slopes.data());
}

TEST(CpuGqaAttention, BackwardMatchesFiniteDifferences) {
  // the GQA model in double: the reference MHA on the repeated tensor; its gradient by central differences in the GQA
  // tensor's own elements, so the group sums come out of the chain rule, not out of sum_groups
  const GqaShape x{1, 6, 4, 2, 4};
  const auto qkv = random_vector(x.qkv(), 13);
  const auto dout = random_vector(x.out(), 14);
  std::vector<float> out(x.out()), lse(x.lse()), dqkv(x.qkv(), std::numeric_limits<float>::quiet_NaN());
  attention_forward_gqa(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.KV, x.D);
  attention_backward_gqa(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.KV, x.D);
  EXPECT_TRUE(
      all_close(out, attention_forward_reference(repeat_kv(to_double(qkv), x), x.B, x.T, x.H, x.D).out, 1e-5, 1e-5));
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(attention_forward_reference(repeat_kv(v, x), x.B, x.T, x.H, x.D).out, dout);
      },
      to_double(qkv));
  EXPECT_TRUE(all_close(dqkv, want, 1e-5, 1e-4));
}

TEST(CpuGqaAttention, KvHeadsEqualHeadsGivesTheBitsOfMha) {
  for (const bool alibi : {false, true}) {
    const int B = 2, T = 150, H = 3, D = 16;
    const auto slopes_vector = alibi_slopes(H);
    const float* slopes = alibi ? slopes_vector.data() : nullptr;
    const auto qkv = random_vector(static_cast<std::size_t>(B) * T * 3 * H * D, 51, -2.0f, 2.0f);
    const auto dout = random_vector(static_cast<std::size_t>(B) * T * H * D, 52);
    std::vector<float> out(dout.size()), lse(B * H * T), dqkv(qkv.size());
    std::vector<float> gqa_out(dout.size()), gqa_lse(B * H * T), gqa_dqkv(qkv.size());
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D, slopes);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, D, slopes);
    attention_forward_gqa(gqa_out.data(), gqa_lse.data(), qkv.data(), B, T, H, H, D, slopes);
    attention_backward_gqa(gqa_dqkv.data(), dout.data(), qkv.data(), gqa_lse.data(), B, T, H, H, D, slopes);
    EXPECT_TRUE(same_bits(gqa_out, out)) << "alibi " << alibi;
    EXPECT_TRUE(same_bits(gqa_lse, lse)) << "alibi " << alibi;
    EXPECT_TRUE(same_bits(gqa_dqkv, dqkv)) << "alibi " << alibi;
  }
}

TEST(CpuGqaAttention, IsDeterministicAndBatchElementsAreIndependent) {
  const GqaShape x{3, 90, 4, 2, 8}, one{1, 90, 4, 2, 8};
  const auto qkv = random_vector(x.qkv(), 61);
  const auto dout = random_vector(x.out(), 62);
  std::vector<float> runs[2];
  for (auto& run : runs) {
    std::vector<float> out(x.out()), lse(x.lse()), dqkv(x.qkv());
    attention_forward_gqa(out.data(), lse.data(), qkv.data(), x.B, x.T, x.H, x.KV, x.D);
    attention_backward_gqa(dqkv.data(), dout.data(), qkv.data(), lse.data(), x.B, x.T, x.H, x.KV, x.D);
    for (const auto* part : {&out, &lse, &dqkv}) run.insert(run.end(), part->begin(), part->end());
  }
  EXPECT_TRUE(same_bits(runs[0], runs[1]));
  const std::size_t dqkv_at = x.out() + x.lse();  // where dqkv starts in a run
  for (int b = 0; b < x.B; ++b) {
    std::vector<float> out1(one.out()), lse1(one.lse()), dqkv1(one.qkv());
    attention_forward_gqa(out1.data(), lse1.data(), qkv.data() + b * one.qkv(), 1, x.T, x.H, x.KV, x.D);
    attention_backward_gqa(dqkv1.data(), dout.data() + b * one.out(), qkv.data() + b * one.qkv(), lse1.data(), 1, x.T,
                           x.H, x.KV, x.D);
    const auto dqkv_b = runs[0].begin() + dqkv_at + b * one.qkv();
    EXPECT_TRUE(same_bits(dqkv1, {dqkv_b, dqkv_b + one.qkv()})) << "batch element " << b;
    EXPECT_TRUE(same_bits(out1, {runs[0].begin() + b * one.out(), runs[0].begin() + (b + 1) * one.out()}));
  }
}

TEST(CpuGqaAttention, RejectsBadHeadCounts) {
  std::vector<float> qkv(64), out(64), lse(8), dqkv(64);
  try {
    attention_forward_gqa(out.data(), lse.data(), qkv.data(), 1, 1, 4, 3, 4);
    ADD_FAILURE() << "heads 4 over kv_heads 3 was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("attention_forward_gqa: precondition failed: heads % kv_heads == 0"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(attention_forward_gqa(out.data(), lse.data(), qkv.data(), 1, 1, 4, 0, 4), std::invalid_argument);
  EXPECT_THROW(attention_forward_gqa(out.data(), lse.data(), qkv.data(), 1, 1, 2, 4, 4), std::invalid_argument);
  EXPECT_THROW(attention_backward_gqa(dqkv.data(), out.data(), qkv.data(), lse.data(), 1, 1, 4, 3, 4),
               std::invalid_argument);
  EXPECT_THROW(attention_backward_gqa(dqkv.data(), out.data(), qkv.data(), lse.data(), 1, 1, 4, -2, 4),
               std::invalid_argument);
  EXPECT_THROW(attention_backward_gqa(qkv.data(), out.data(), qkv.data(), lse.data(), 1, 1, 4, 2, 4),
               std::invalid_argument);  // dqkv aliases qkv
  // the old kernels' messages still name them, not the GQA kernels they share their code with
  try {
    attention_forward(out.data(), lse.data(), qkv.data(), 1, 0, 1, 4);
    ADD_FAILURE() << "seq 0 was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("twin::kernels::cpu::attention_forward: "), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace twin::kernels::cpu

// The tiled fused attention (kernels/cpu/flash_attention.hpp, the CPU mirror of the CUDA kernels) against the plain
// attention (attention.hpp) on causal, grouped-query and ALiBi shapes that end in partial tiles, forward and backward;
// its backward against finite differences of the double reference; and its block functions (what ring attention
// builds on) splitting one sequence into blocks at absolute offsets, merged by their lse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

#include "attention_reference.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/flash_attention.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

struct Shape {
  int B, T, H, KV, D;
  std::size_t qkv() const { return static_cast<std::size_t>(B) * T * (H + 2 * KV) * D; }
  std::size_t out() const { return static_cast<std::size_t>(B) * T * H * D; }
  std::size_t lse() const { return static_cast<std::size_t>(B) * H * T; }
};

struct Forward {
  std::vector<float> out, lse;
};

Forward plain_forward(const std::vector<float>& qkv, const Shape& x, const float* slopes) {
  Forward f{std::vector<float>(x.out()), std::vector<float>(x.lse())};
  attention_forward_gqa(f.out.data(), f.lse.data(), qkv.data(), x.B, x.T, x.H, x.KV, x.D, slopes);
  return f;
}

Forward flash_forward(const std::vector<float>& qkv, const Shape& x, const float* slopes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();  // every element must be written
  Forward f{std::vector<float>(x.out(), nan), std::vector<float>(x.lse(), nan)};
  flash_attention_forward(f.out.data(), f.lse.data(), qkv.data(), x.B, x.T, x.H, x.KV, x.D, slopes);
  return f;
}

// Shapes whose sequences end inside a tile (64 queries, 64 keys; 32 queries in the dk/dv pass above head_dim 64):
// multi-head, grouped-query, multi-query, a sequence shorter than one tile, a head_dim of 128.
const Shape kShapes[] = {
    {2, 100, 3, 3, 16},  // multi-head, two tiles, the second partial
    {1, 150, 4, 2, 32},  // grouped-query, three tiles
    {2, 70, 4, 1, 8},    // multi-query
    {1, 17, 2, 1, 64},   // less than one tile
    {1, 97, 2, 2, 128},  // the dk/dv pass in 32-row query steps
    {1, 129, 2, 1, 32},  // a last query tile of one row, whose own key opens a key tile
};

TEST(CpuFlashAttention, ForwardMatchesPlainAttention) {
  for (const Shape& x : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B " << x.B << " T " << x.T << " H " << x.H << " KV " << x.KV << " D " << x.D);
    const auto qkv = random_vector(x.qkv(), 7, -1.5f, 1.5f);
    const Forward want = plain_forward(qkv, x, nullptr), got = flash_forward(qkv, x, nullptr);
    EXPECT_TRUE(all_close(got.out, want.out, 1e-6, 1e-5));
    EXPECT_TRUE(all_close(got.lse, want.lse, 1e-6, 1e-5));
  }
}

TEST(CpuFlashAttention, BackwardMatchesPlainAttention) {
  for (const Shape& x : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B " << x.B << " T " << x.T << " H " << x.H << " KV " << x.KV << " D " << x.D);
    const auto qkv = random_vector(x.qkv(), 8, -1.5f, 1.5f);
    const auto dout = random_vector(x.out(), 9);
    const Forward f = plain_forward(qkv, x, nullptr);
    std::vector<float> want(x.qkv()), got(x.qkv(), std::numeric_limits<float>::quiet_NaN());  // overwritten whole
    attention_backward_gqa(want.data(), dout.data(), qkv.data(), f.lse.data(), x.B, x.T, x.H, x.KV, x.D);
    flash_attention_backward(got.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), x.B, x.T, x.H, x.KV, x.D);
    EXPECT_TRUE(all_close(got, want, 1e-5, 1e-4));
  }
}

TEST(CpuFlashAttention, AlibiMatchesPlainAttention) {
  const Shape x{2, 90, 4, 2, 16};
  const std::vector<float> slopes = alibi_slopes(8);  // the rank's 4 heads of 8: slopes of global heads 4..7
  const float* mine = slopes.data() + 4;
  const auto qkv = random_vector(x.qkv(), 10, -1.5f, 1.5f);
  const auto dout = random_vector(x.out(), 11);
  const Forward want = plain_forward(qkv, x, mine), got = flash_forward(qkv, x, mine);
  EXPECT_TRUE(all_close(got.out, want.out, 1e-6, 1e-5));
  EXPECT_TRUE(all_close(got.lse, want.lse, 1e-6, 1e-5));
  std::vector<float> dwant(x.qkv()), dgot(x.qkv());
  attention_backward_gqa(dwant.data(), dout.data(), qkv.data(), want.lse.data(), x.B, x.T, x.H, x.KV, x.D, mine);
  flash_attention_backward(dgot.data(), dout.data(), qkv.data(), got.out.data(), got.lse.data(), x.B, x.T, x.H, x.KV,
                           x.D, mine);
  EXPECT_TRUE(all_close(dgot, dwant, 1e-5, 1e-4));
}

// the multi-head layout (B, T, 3, H, D) of the double reference from a grouped-query qkv: k and v repeated per group
std::vector<double> repeat_kv(const std::vector<double>& qkv, const Shape& x) {
  std::vector<double> mha(static_cast<std::size_t>(x.B) * x.T * 3 * x.H * x.D);
  const int group = x.H / x.KV;
  const auto at = [&](int b, int t, int first, int head, int d) {
    return (static_cast<std::size_t>(b) * x.T + t) * (x.H + 2 * x.KV) * x.D +
           static_cast<std::size_t>(first + head) * x.D + d;
  };
  for (int b = 0; b < x.B; ++b)
    for (int t = 0; t < x.T; ++t)
      for (int h = 0; h < x.H; ++h)
        for (int d = 0; d < x.D; ++d) {
          mha[testing::qkv_index(b, t, 0, h, d, x.T, x.H, x.D)] = qkv[at(b, t, 0, h, d)];
          mha[testing::qkv_index(b, t, 1, h, d, x.T, x.H, x.D)] = qkv[at(b, t, x.H, h / group, d)];
          mha[testing::qkv_index(b, t, 2, h, d, x.T, x.H, x.D)] = qkv[at(b, t, x.H + x.KV, h / group, d)];
        }
  return mha;
}

// d(sum dout * out)/d qkv of the exact attention (double, one row at a time), through two key tiles and a grouped
// kv head: what the mirror's backward must compute, independently of the plain kernels
TEST(CpuFlashAttention, BackwardMatchesFiniteDifferences) {
  const Shape x{1, 70, 2, 1, 4};
  const auto qkv = random_vector(x.qkv(), 12);
  const auto dout = random_vector(x.out(), 13);
  const Forward f = flash_forward(qkv, x, nullptr);
  std::vector<float> got(x.qkv());
  flash_attention_backward(got.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), x.B, x.T, x.H, x.KV, x.D);
  const auto want = testing::numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(testing::attention_forward_reference(repeat_kv(v, x), x.B, x.T, x.H, x.D).out, dout);
      },
      to_double(qkv));
  EXPECT_TRUE(all_close(got, want, 1e-5, 1e-4));
}

// One sequence of T tokens cut into blocks at absolute offsets, as ring attention holds it: each query block against
// each key/value block (the pairs wholly in the future see nothing), partials merged by lse, then the backward of
// every pair summed; the results must be the whole sequence's.
TEST(CpuFlashAttention, BlocksAtOffsetsMergeIntoTheWholeSequence) {
  const Shape x{2, 150, 4, 2, 16};
  const int cuts[] = {0, 40, 100, 150};  // blocks [0, 40), [40, 100), [100, 150): not tile multiples
  const auto qkv = random_vector(x.qkv(), 14, -1.5f, 1.5f);
  const auto dout = random_vector(x.out(), 15);
  const Forward whole = flash_forward(qkv, x, nullptr);
  std::vector<float> whole_grad(x.qkv());
  flash_attention_backward(whole_grad.data(), dout.data(), qkv.data(), whole.out.data(), whole.lse.data(), x.B, x.T,
                           x.H, x.KV, x.D);

  const std::size_t qkv_token = static_cast<std::size_t>(x.H + 2 * x.KV) * x.D, out_token = std::size_t(x.H) * x.D;
  const auto in_rows = [&](const float* base, int start, std::size_t offset) {
    return HeadRows<const float>{base + start * qkv_token + offset, x.T * qkv_token, qkv_token};
  };
  std::vector<float> grad(x.qkv(), 0.0f);
  for (int qb = 0; qb < 3; ++qb) {
    const int q0 = cuts[qb], q_len = cuts[qb + 1] - cuts[qb];
    // (B, q_len, H, D) and (B, H, q_len), dense: what a rank holds for its query block
    std::vector<float> out(static_cast<std::size_t>(x.B) * q_len * out_token, 0.0f);
    std::vector<float> lse(static_cast<std::size_t>(x.B) * x.H * q_len, -std::numeric_limits<float>::infinity());
    const HeadRows<float> out_rows{out.data(), q_len * out_token, out_token};
    const HeadRows<const float> out_const{out.data(), q_len * out_token, out_token};
    for (int kb = 0; kb < 3; ++kb) {
      const FlashBlock block{x.B, x.H, x.KV, x.D, q0, q_len, cuts[kb], cuts[kb + 1] - cuts[kb], nullptr};
      std::vector<float> part(out.size()), part_lse(lse.size());
      flash_attention_block_forward({part.data(), q_len * out_token, out_token}, part_lse.data(),
                                    in_rows(qkv.data(), q0, 0), in_rows(qkv.data(), cuts[kb], x.H * x.D),
                                    in_rows(qkv.data(), cuts[kb], (x.H + x.KV) * x.D), block);
      if (kb > qb) {  // wholly in the future: nothing seen
        for (float l : part_lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
        for (float o : part) EXPECT_EQ(o, 0.0f);
      }
      flash_attention_merge(out_rows, lse.data(), {part.data(), q_len * out_token, out_token}, part_lse.data(), x.B,
                            q_len, x.H, x.D);
    }
    for (int b = 0; b < x.B; ++b) {
      for (int t = 0; t < q_len; ++t) {
        for (std::size_t e = 0; e < out_token; ++e) {
          const float want = whole.out[(static_cast<std::size_t>(b) * x.T + q0 + t) * out_token + e];
          ASSERT_NEAR(out[(static_cast<std::size_t>(b) * q_len + t) * out_token + e], want, 1e-5);
        }
        for (int h = 0; h < x.H; ++h) {
          ASSERT_NEAR(lse[(static_cast<std::size_t>(b) * x.H + h) * q_len + t],
                      whole.lse[(static_cast<std::size_t>(b) * x.H + h) * x.T + q0 + t], 1e-5);
        }
      }
    }
    // the backward of every pair of this query block, with the merged (global) lse and delta
    const HeadRows<const float> dout_rows{dout.data() + q0 * out_token, x.T * out_token, out_token};
    std::vector<float> delta(lse.size());
    flash_attention_delta(delta.data(), dout_rows, out_const, x.B, q_len, x.H, x.D);
    const auto grad_rows = [&](int start, std::size_t offset) {
      return HeadRows<float>{grad.data() + start * qkv_token + offset, x.T * qkv_token, qkv_token};
    };
    for (int kb = 0; kb <= qb; ++kb) {
      const FlashBlock block{x.B, x.H, x.KV, x.D, q0, q_len, cuts[kb], cuts[kb + 1] - cuts[kb], nullptr};
      flash_attention_block_backward(
          grad_rows(q0, 0), grad_rows(cuts[kb], x.H * x.D), grad_rows(cuts[kb], (x.H + x.KV) * x.D), dout_rows,
          in_rows(qkv.data(), q0, 0), in_rows(qkv.data(), cuts[kb], x.H * x.D),
          in_rows(qkv.data(), cuts[kb], (x.H + x.KV) * x.D), lse.data(), delta.data(), block);
    }
  }
  EXPECT_TRUE(all_close(grad, whole_grad, 1e-5, 1e-4));
}

TEST(CpuFlashAttention, MergeWithAnEmptyPartialKeepsTheOther) {
  std::vector<float> out = {1, 2, 3, 4}, lse = {0.5f, -1.0f};  // (1, 2, 1, 2)
  const std::vector<float> none = {0, 0, 0, 0};
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> none_lse = {-inf, -inf};
  flash_attention_merge({out.data(), 4, 2}, lse.data(), {none.data(), 4, 2}, none_lse.data(), 1, 2, 1, 2);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(lse, (std::vector<float>{0.5f, -1.0f}));
  // two equal partials: the same output, lse + log 2
  const std::vector<float> same = out, same_lse = lse;
  flash_attention_merge({out.data(), 4, 2}, lse.data(), {same.data(), 4, 2}, same_lse.data(), 1, 2, 1, 2);
  EXPECT_TRUE(all_close(out, same, 1e-7, 1e-6));
  EXPECT_NEAR(lse[0], 0.5 + std::log(2.0), 1e-6);
}

TEST(CpuFlashAttention, IsDeterministic) {
  const Shape x{1, 130, 4, 2, 32};
  const auto qkv = random_vector(x.qkv(), 16);
  const auto dout = random_vector(x.out(), 17);
  const Forward a = flash_forward(qkv, x, nullptr), b = flash_forward(qkv, x, nullptr);
  EXPECT_TRUE(testing::same_bits(a.out, b.out) && testing::same_bits(a.lse, b.lse));
  std::vector<float> da(x.qkv()), db(x.qkv());
  flash_attention_backward(da.data(), dout.data(), qkv.data(), a.out.data(), a.lse.data(), x.B, x.T, x.H, x.KV, x.D);
  flash_attention_backward(db.data(), dout.data(), qkv.data(), a.out.data(), a.lse.data(), x.B, x.T, x.H, x.KV, x.D);
  EXPECT_TRUE(testing::same_bits(da, db));
}

TEST(CpuFlashAttention, RejectsBadArguments) {
  std::vector<float> qkv(5 * 16 * 2), out(3 * 16 * 2), lse(3 * 2);
  EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), qkv.data(), 1, 2, 3, 2, 16), std::invalid_argument);
  EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), qkv.data(), 1, 0, 3, 1, 16), std::invalid_argument);
  EXPECT_THROW(flash_attention_forward(qkv.data(), lse.data(), qkv.data(), 1, 2, 3, 1, 16), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

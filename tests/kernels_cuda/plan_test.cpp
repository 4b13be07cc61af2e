// The GEMM plans of kernels/cuda/gemm_plan.hpp, executed on the CPU exactly as cuBLASLt reads them (column-major,
// leading dimensions, batch strides and offsets), against kernels/cpu: the index math of the device's linear layers
// and attention is checked on any machine, without a GPU.
#include "kernels/cuda/gemm_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/matmul.hpp"

namespace twin::kernels::cuda {
namespace {

using cpu::testing::all_close;
using cpu::testing::random_vector;

// D_i = alpha op(A_i) op(B_i) + beta D_i for every batch entry i, as cuBLASLt defines it (double accumulation).
// When `writes` is given, counts how often each element of D is written.
void run_plan_on_cpu(const GemmPlan& p, const float* A, const float* B, float* D, std::vector<int>* writes = nullptr) {
  for (int i = 0; i < p.batch; ++i) {
    const float* a = A + p.offset_a + i * p.stride_a;
    const float* b = B + p.offset_b + i * p.stride_b;
    const std::int64_t d_base = p.offset_d + i * p.stride_d;
    for (int col = 0; col < p.n; ++col) {
      for (int row = 0; row < p.m; ++row) {
        double sum = 0.0;
        for (int kk = 0; kk < p.k; ++kk) {
          const double a_value = p.trans_a ? a[kk + row * p.lda] : a[row + kk * p.lda];  // op(A)(row, kk)
          const double b_value = p.trans_b ? b[col + kk * p.ldb] : b[kk + col * p.ldb];  // op(B)(kk, col)
          sum += a_value * b_value;
        }
        float& d = D[d_base + row + col * p.ldd];
        d = static_cast<float>(p.alpha * sum + (p.beta != 0.0f ? p.beta * static_cast<double>(d) : 0.0));
        if (writes != nullptr) ++(*writes)[d_base + row + col * p.ldd];
      }
    }
  }
}

TEST(CudaGemmPlan, LinearForwardMatchesCpuMatmul) {
  const int rows = 19, in_features = 24, out_features = 13;
  const auto inp = random_vector(rows * in_features, 1);
  const auto weight = random_vector(out_features * in_features, 2);
  const auto bias = random_vector(out_features, 3);
  std::vector<float> want(rows * out_features), got(rows * out_features, std::nanf(""));
  cpu::matmul_forward(want.data(), inp.data(), weight.data(), bias.data(), rows, in_features, out_features);
  run_plan_on_cpu(plan_linear_forward(rows, in_features, out_features), weight.data(), inp.data(), got.data());
  // the bias epilogue adds bias[row of the column-major D] = bias[output feature]
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out_features; ++o) got[r * out_features + o] += bias[o];
  }
  EXPECT_TRUE(all_close(got, want, 1e-5, 1e-5));
}

TEST(CudaGemmPlan, LinearBackwardMatchesCpuMatmul) {
  const int rows = 11, in_features = 16, out_features = 9;
  const auto inp = random_vector(rows * in_features, 4);
  const auto weight = random_vector(out_features * in_features, 5);
  const auto dout = random_vector(rows * out_features, 6);
  const auto dweight_before = random_vector(out_features * in_features, 7);
  std::vector<float> want_dinp(rows * in_features), want_dweight = dweight_before;
  cpu::matmul_backward(want_dinp.data(), want_dweight.data(), nullptr, dout.data(), inp.data(), weight.data(), rows,
                       in_features, out_features);
  std::vector<float> dinp(rows * in_features, std::nanf("")), dweight = dweight_before;
  run_plan_on_cpu(plan_linear_backward_input(rows, in_features, out_features), weight.data(), dout.data(), dinp.data());
  run_plan_on_cpu(plan_linear_backward_weight(rows, in_features, out_features), inp.data(), dout.data(),
                  dweight.data());
  EXPECT_TRUE(all_close(dinp, want_dinp, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(dweight, want_dweight, 1e-5, 1e-5));  // accumulated: beta = 1
}

// The device's causal softmax (kernels/cuda/attention.cu), row by row on the host.
void softmax_forward_on_cpu(std::vector<float>& probs, float* lse, const std::vector<float>& scores, int rows,
                            int seq) {
  for (int i = 0; i < rows; ++i) {
    const int t = i % seq;
    const float* s = scores.data() + static_cast<std::size_t>(i) * seq;
    float max_score = -std::numeric_limits<float>::infinity();
    for (int t2 = 0; t2 <= t; ++t2) max_score = std::max(max_score, s[t2]);
    double sum = 0.0;
    for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(s[t2] - max_score);
    lse[i] = max_score + static_cast<float>(std::log(sum));
    for (int t2 = 0; t2 < seq; ++t2)
      probs[static_cast<std::size_t>(i) * seq + t2] = t2 <= t ? std::exp(s[t2] - lse[i]) : 0;
  }
}

void softmax_backward_on_cpu(std::vector<float>& probs, std::vector<float>& dscores, const std::vector<float>& scores,
                             const std::vector<float>& dprobs, const float* lse, int rows, int seq, float scale) {
  for (int i = 0; i < rows; ++i) {
    const int t = i % seq;
    const std::size_t offset = static_cast<std::size_t>(i) * seq;
    double p_dp = 0.0;
    for (int t2 = 0; t2 <= t; ++t2) p_dp += std::exp(scores[offset + t2] - lse[i]) * dprobs[offset + t2];
    for (int t2 = 0; t2 < seq; ++t2) {
      const float p = t2 <= t ? std::exp(scores[offset + t2] - lse[i]) : 0.0f;
      probs[offset + t2] = p;
      dscores[offset + t2] = t2 <= t ? scale * p * (dprobs[offset + t2] - static_cast<float>(p_dp)) : 0.0f;
    }
  }
}

// the same plan writing into a larger tensor, `offset` elements further
GemmPlan shifted(GemmPlan plan, std::size_t offset) {
  plan.offset_d += static_cast<std::int64_t>(offset);
  return plan;
}

struct PlanAttentionCase {
  int batch, seq, heads, head_dim;
};
std::ostream& operator<<(std::ostream& out, const PlanAttentionCase& c) {
  return out << "B " << c.batch << " T " << c.seq << " H " << c.heads << " D " << c.head_dim;
}

class CudaAttentionPlan : public ::testing::TestWithParam<PlanAttentionCase> {};

TEST_P(CudaAttentionPlan, ForwardAndBackwardMatchCpuAttention) {
  const auto [B, T, H, D] = GetParam();
  const AttentionShape shape{T, H, D};
  const std::size_t qkv_count = static_cast<std::size_t>(B) * T * 3 * H * D;
  const std::size_t out_count = static_cast<std::size_t>(B) * T * H * D;
  const auto qkv = random_vector(qkv_count, 21, -2.0f, 2.0f);
  const auto dout = random_vector(out_count, 22);
  std::vector<float> want_out(out_count), want_lse(static_cast<std::size_t>(B) * H * T), want_dqkv(qkv_count);
  cpu::attention_forward(want_out.data(), want_lse.data(), qkv.data(), B, T, H, D);
  cpu::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), want_lse.data(), B, T, H, D);

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int rows = H * T;
  std::vector<float> out(out_count, std::nanf("")), lse(want_lse.size(), std::nanf("")), dqkv(qkv_count, std::nanf(""));
  std::vector<int> out_writes(out_count), dqkv_writes(qkv_count);
  std::vector<float> scores(static_cast<std::size_t>(rows) * T), probs(scores.size()), dprobs(scores.size()),
      dscores(scores.size());
  for (int b = 0; b < B; ++b) {  // attention.cu's loop, with host pointers
    const float* qkv_b = qkv.data() + static_cast<std::size_t>(b) * T * shape.qkv_row();
    const float* dout_b = dout.data() + static_cast<std::size_t>(b) * T * shape.hidden();
    const std::size_t out_offset = static_cast<std::size_t>(b) * T * shape.hidden();
    const std::size_t dqkv_offset = static_cast<std::size_t>(b) * T * shape.qkv_row();
    float* lse_b = lse.data() + static_cast<std::size_t>(b) * rows;
    std::vector<int> scratch_writes(scores.size());
    run_plan_on_cpu(plan_attention_scores(shape, scale), qkv_b, qkv_b, scores.data(), &scratch_writes);
    for (int w : scratch_writes) ASSERT_EQ(w, 1) << "every score written once";
    softmax_forward_on_cpu(probs, lse_b, scores, rows, T);
    run_plan_on_cpu(shifted(plan_attention_output(shape), out_offset), qkv_b, probs.data(), out.data(), &out_writes);

    run_plan_on_cpu(plan_attention_dprobs(shape), qkv_b, dout_b, dprobs.data());
    softmax_backward_on_cpu(probs, dscores, scores, dprobs, lse_b, rows, T, scale);
    run_plan_on_cpu(shifted(plan_attention_dvalue(shape), dqkv_offset), dout_b, probs.data(), dqkv.data(),
                    &dqkv_writes);
    run_plan_on_cpu(shifted(plan_attention_dquery(shape), dqkv_offset), qkv_b, dscores.data(), dqkv.data(),
                    &dqkv_writes);
    run_plan_on_cpu(shifted(plan_attention_dkey(shape), dqkv_offset), qkv_b, dscores.data(), dqkv.data(), &dqkv_writes);
  }
  for (std::size_t i = 0; i < out_count; ++i) ASSERT_EQ(out_writes[i], 1) << "out element " << i;
  for (std::size_t i = 0; i < qkv_count; ++i) ASSERT_EQ(dqkv_writes[i], 1) << "dqkv element " << i;
  EXPECT_TRUE(all_close(out, want_out, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(lse, want_lse, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(dqkv, want_dqkv, 1e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionPlan,
                         ::testing::Values(PlanAttentionCase{1, 1, 1, 1}, PlanAttentionCase{2, 7, 3, 4},
                                           PlanAttentionCase{3, 16, 2, 8}, PlanAttentionCase{1, 33, 4, 16}));

// --- grouped-query attention ----------------------------------------------------------------------------------------
// Its plans in the order kernels/cuda/attention.cu issues them, against kernels/cpu's attention_forward_gqa and
// attention_backward_gqa.

struct PlanGqaCase {
  int batch, seq, heads, kv_heads, head_dim;
};
std::ostream& operator<<(std::ostream& out, const PlanGqaCase& c) {
  return out << "B " << c.batch << " T " << c.seq << " H " << c.heads << " KV " << c.kv_heads << " D " << c.head_dim;
}

class CudaGroupedAttentionPlan : public ::testing::TestWithParam<PlanGqaCase> {};

TEST_P(CudaGroupedAttentionPlan, ForwardAndBackwardMatchCpuGqa) {
  const auto [B, T, H, KV, D] = GetParam();
  const GroupedAttentionShape shape{T, H, KV, D};
  const int G = shape.group();
  const std::size_t qkv_count = static_cast<std::size_t>(B) * T * shape.qkv_row();
  const std::size_t out_count = static_cast<std::size_t>(B) * T * H * D;
  const auto qkv = random_vector(qkv_count, 31, -2.0f, 2.0f);
  const auto dout = random_vector(out_count, 32);
  std::vector<float> want_out(out_count), want_lse(static_cast<std::size_t>(B) * H * T), want_dqkv(qkv_count);
  cpu::attention_forward_gqa(want_out.data(), want_lse.data(), qkv.data(), B, T, H, KV, D);
  cpu::attention_backward_gqa(want_dqkv.data(), dout.data(), qkv.data(), want_lse.data(), B, T, H, KV, D);

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int rows = H * T;
  std::vector<float> out(out_count, std::nanf("")), lse(want_lse.size(), std::nanf("")), dqkv(qkv_count, std::nanf(""));
  std::vector<int> out_writes(out_count), dqkv_writes(qkv_count);
  std::vector<float> scores(static_cast<std::size_t>(rows) * T), probs(scores.size()), dprobs(scores.size()),
      dscores(scores.size());
  const std::size_t kv_count = static_cast<std::size_t>(KV) * shape.kv_sum_per_head();
  for (int b = 0; b < B; ++b) {  // attention.cu's loops, with host pointers
    const float* qkv_b = qkv.data() + static_cast<std::size_t>(b) * T * shape.qkv_row();
    const float* dout_b = dout.data() + static_cast<std::size_t>(b) * T * shape.hidden();
    const std::size_t out_offset = static_cast<std::size_t>(b) * T * shape.hidden();
    const std::size_t dqkv_offset = static_cast<std::size_t>(b) * T * shape.qkv_row();
    float* lse_b = lse.data() + static_cast<std::size_t>(b) * rows;
    std::fill(scores.begin(), scores.end(), std::nanf(""));
    std::vector<int> scratch_writes(scores.size());
    for (int j = 0; j < G; ++j) {
      run_plan_on_cpu(plan_grouped_attention_scores(shape, j, scale), qkv_b, qkv_b, scores.data(), &scratch_writes);
    }
    for (int w : scratch_writes) ASSERT_EQ(w, 1) << "every score written once";
    softmax_forward_on_cpu(probs, lse_b, scores, rows, T);
    for (int j = 0; j < G; ++j) {
      run_plan_on_cpu(shifted(plan_grouped_attention_output(shape, j), out_offset), qkv_b, probs.data(), out.data(),
                      &out_writes);
    }

    std::fill(dprobs.begin(), dprobs.end(), std::nanf(""));
    std::vector<int> dprobs_writes(dprobs.size());
    for (int j = 0; j < G; ++j) {
      run_plan_on_cpu(plan_grouped_attention_dprobs(shape, j), qkv_b, dout_b, dprobs.data(), &dprobs_writes);
    }
    for (int w : dprobs_writes) ASSERT_EQ(w, 1) << "every dP written once";
    softmax_backward_on_cpu(probs, dscores, scores, dprobs, lse_b, rows, T, scale);
    // the fp32 sums start as garbage: the j = 0 GEMMs (beta 0) must overwrite them
    std::vector<float> dk_sum(kv_count, std::nanf("")), dv_sum(kv_count, std::nanf(""));
    std::vector<int> dk_writes(kv_count), dv_writes(kv_count);
    for (int j = 0; j < G; ++j) {
      run_plan_on_cpu(plan_grouped_attention_dvalue(shape, j), dout_b, probs.data(), dv_sum.data(), &dv_writes);
      run_plan_on_cpu(shifted(plan_grouped_attention_dquery(shape, j), dqkv_offset), qkv_b, dscores.data(), dqkv.data(),
                      &dqkv_writes);
      run_plan_on_cpu(plan_grouped_attention_dkey(shape, j), qkv_b, dscores.data(), dk_sum.data(), &dk_writes);
    }
    for (std::size_t e = 0; e < kv_count; ++e) {
      ASSERT_EQ(dk_writes[e], G) << "dk sum " << e << ": once per query head of the group";
      ASSERT_EQ(dv_writes[e], G) << "dv sum " << e;
    }
    // grouped_kv_gradient_kernel: element e = (g T + t) D + d of the sums into the k and v slots
    for (std::size_t e = 0; e < kv_count; ++e) {
      const std::size_t d = e % D, t = (e / D) % T, g = e / (static_cast<std::size_t>(D) * T);
      const std::size_t token = dqkv_offset + t * shape.qkv_row();
      const std::size_t k_index = token + (H + g) * D + d, v_index = token + (H + KV + g) * D + d;
      dqkv[k_index] = dk_sum[e];
      dqkv[v_index] = dv_sum[e];
      ++dqkv_writes[k_index];
      ++dqkv_writes[v_index];
    }
  }
  for (std::size_t i = 0; i < out_count; ++i) ASSERT_EQ(out_writes[i], 1) << "out element " << i;
  for (std::size_t i = 0; i < qkv_count; ++i) ASSERT_EQ(dqkv_writes[i], 1) << "dqkv element " << i;
  EXPECT_TRUE(all_close(out, want_out, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(lse, want_lse, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(dqkv, want_dqkv, 1e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGroupedAttentionPlan,
                         ::testing::Values(PlanGqaCase{1, 1, 2, 1, 1}, PlanGqaCase{2, 7, 4, 2, 4},
                                           PlanGqaCase{1, 9, 3, 1, 8}, PlanGqaCase{3, 16, 6, 3, 8},
                                           PlanGqaCase{1, 33, 8, 2, 16},
                                           PlanGqaCase{2, 5, 4, 4, 4}));  // the last: one query head per kv head

// With kv_heads == heads (one group per head, j = 0) every grouped plan is its multi-head twin of gemm_plan.hpp.
TEST(CudaGroupedAttentionPlan, WithOneQueryHeadPerKvHeadTheyAreTheMultiHeadPlans) {
  const int T = 13, H = 5, D = 8;
  const GroupedAttentionShape grouped{T, H, H, D};
  const AttentionShape mha{T, H, D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto same = [](const GemmPlan& a, const GemmPlan& b) {
    return a.trans_a == b.trans_a && a.trans_b == b.trans_b && a.m == b.m && a.n == b.n && a.k == b.k &&
           a.lda == b.lda && a.ldb == b.ldb && a.ldd == b.ldd && a.batch == b.batch && a.stride_a == b.stride_a &&
           a.stride_b == b.stride_b && a.stride_d == b.stride_d && a.offset_a == b.offset_a &&
           a.offset_b == b.offset_b && a.offset_d == b.offset_d && a.alpha == b.alpha && a.beta == b.beta;
  };
  EXPECT_TRUE(same(plan_grouped_attention_scores(grouped, 0, scale), plan_attention_scores(mha, scale)));
  EXPECT_TRUE(same(plan_grouped_attention_output(grouped, 0), plan_attention_output(mha)));
  EXPECT_TRUE(same(plan_grouped_attention_dprobs(grouped, 0), plan_attention_dprobs(mha)));
  EXPECT_TRUE(same(plan_grouped_attention_dquery(grouped, 0), plan_attention_dquery(mha)));
  EXPECT_EQ(grouped.qkv_row(), mha.qkv_row());
  EXPECT_EQ(grouped.v_offset(), 2 * mha.hidden());
}

}  // namespace
}  // namespace twin::kernels::cuda

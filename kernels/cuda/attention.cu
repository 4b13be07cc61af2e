#include "kernels/cuda/attention.cuh"

#include <cmath>
#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/gemm_plan.hpp"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;
using device::warp_max;
using device::warp_sum;

namespace {

// Score (t, t2) of a row of head h with the ALiBi bias: s[t2] + m_h (t2 - t), m_h = slopes[h], or 0 when slopes is
// nullptr: s[t2] + 0 (t2 - t) keeps every score's value, so the path without ALiBi gives the probabilities it gave
// before, without a branch per element. Every pass over a row recomputes the score by this one expression, so they
// all see the same biased scores.
struct AlibiRow {
  float slope;
  int t;
  __device__ AlibiRow(const float* slopes, int h, int t_) : slope(slopes != nullptr ? slopes[h] : 0.0f), t(t_) {}
  __device__ float operator()(const float* s, int t2) const { return s[t2] + slope * static_cast<float>(t2 - t); }
};

// One warp per score row i = h * seq + t of one sequence (rows = heads * seq), scores (heads, seq, seq) fp32 (already
// scaled), slopes (heads) fp32 or nullptr; a[t2] = s[t2] + slopes[h] (t2 - t), the biased score:
//   lse[i] = log sum_{t2 <= t} exp(a[t2]),  probs[i, t2] = exp(a[t2] - lse[i]) for t2 <= t, 0 after (the mask)
__global__ void causal_softmax_forward_kernel(bf16* probs, float* lse, const float* scores, const float* slopes,
                                              int rows, int seq) {
  const int i = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (i >= rows) return;
  const int lane = threadIdx.x % 32;
  const int t = i % seq;
  const AlibiRow a(slopes, i / seq, t);
  const float* s = scores + static_cast<std::size_t>(i) * seq;
  bf16* p = probs + static_cast<std::size_t>(i) * seq;
  float max_score = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) max_score = fmaxf(max_score, a(s, t2));
  max_score = warp_max(max_score);  // finite: t2 = 0 is always there
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) sum += expf(a(s, t2) - max_score);
  const float row_lse = max_score + logf(warp_sum(sum));
  for (int t2 = lane; t2 < seq; t2 += 32) {
    p[t2] = __float2bfloat16_rn(t2 <= t ? expf(a(s, t2) - row_lse) : 0.0f);
  }
  if (lane == 0) lse[i] = row_lse;
}

// One warp per score row, given S (recomputed), dP = dout v^T and the forward's slopes:
//   p = exp(a - lse),  ds = scale p (dp - sum_t2 p dp)   for t2 <= t;  probs, dscores = 0 after t
// (a = s + m_h (t2 - t): the bias is a constant, dS needs no term of its own)
__global__ void causal_softmax_backward_kernel(bf16* probs, bf16* dscores, const float* scores, const float* dprobs,
                                               const float* lse, const float* slopes, int rows, int seq, float scale) {
  const int i = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (i >= rows) return;
  const int lane = threadIdx.x % 32;
  const int t = i % seq;
  const AlibiRow a(slopes, i / seq, t);
  const std::size_t offset = static_cast<std::size_t>(i) * seq;
  const float* s = scores + offset;
  const float* dp = dprobs + offset;
  const float row_lse = lse[i];
  float p_dp = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) p_dp += expf(a(s, t2) - row_lse) * dp[t2];
  p_dp = warp_sum(p_dp);
  for (int t2 = lane; t2 < seq; t2 += 32) {
    float p = 0.0f;
    float ds = 0.0f;
    if (t2 <= t) {
      p = expf(a(s, t2) - row_lse);
      ds = scale * p * (dp[t2] - p_dp);
    }
    probs[offset + t2] = __float2bfloat16_rn(p);
    dscores[offset + t2] = __float2bfloat16_rn(ds);
  }
}

// dk and dv of one sequence, summed in fp32 over each kv head's group, rounded once into dqkv_b's k and v slots:
//   dqkv_b[t, (H + g) D + d] = dk_sum[g, t, d],   dqkv_b[t, (H + KV + g) D + d] = dv_sum[g, t, d]
// element e = (g T + t) D + d of the (KV, T, D) sums
__global__ void grouped_kv_gradient_kernel(bf16* dqkv_b, const float* dk_sum, const float* dv_sum, std::size_t n,
                                           int seq, int heads, int kv_heads, int head_dim) {
  const std::size_t row = static_cast<std::size_t>(heads + 2 * kv_heads) * head_dim;
  TWIN_GRID_STRIDE_LOOP(e, n) {
    const std::size_t d = e % static_cast<std::size_t>(head_dim);
    const std::size_t rest = e / static_cast<std::size_t>(head_dim);
    const std::size_t t = rest % static_cast<std::size_t>(seq);
    const std::size_t g = rest / static_cast<std::size_t>(seq);
    bf16* token = dqkv_b + t * row;
    token[(static_cast<std::size_t>(heads) + g) * head_dim + d] = __float2bfloat16_rn(dk_sum[e]);
    token[(static_cast<std::size_t>(heads + kv_heads) + g) * head_dim + d] = __float2bfloat16_rn(dv_sum[e]);
  }
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int head_dim,
                       Cublas& blas, cudaStream_t stream, const float* alibi_slopes) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && heads > 0 && head_dim > 0);
  TWIN_CUDA_REQUIRE(static_cast<std::int64_t>(heads) * seq <= INT32_MAX);  // score rows of one sequence: int
  TWIN_CUDA_REQUIRE(out != nullptr && lse != nullptr && qkv != nullptr);
  TWIN_CUDA_REQUIRE(static_cast<const void*>(out) != static_cast<const void*>(qkv));
  const AttentionShape shape{seq, heads, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t score_count = static_cast<std::size_t>(heads) * shape.scores_per_head();
  device::Scratch scores(score_count * sizeof(float), stream);  // (heads, seq, seq)
  device::Scratch probs(score_count * sizeof(bf16), stream);    // (heads, seq, seq)
  const int rows = heads * seq;
  for (int b = 0; b < batch; ++b) {
    const bf16* qkv_b = qkv + static_cast<std::size_t>(b) * seq * shape.qkv_row();
    bf16* out_b = out + static_cast<std::size_t>(b) * seq * shape.hidden();
    float* lse_b = lse + static_cast<std::size_t>(b) * rows;
    gemm(blas, plan_attention_scores(shape, scale), qkv_b, qkv_b, scores.as<float>(), CUDA_R_32F, stream);
    causal_softmax_forward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        probs.as<bf16>(), lse_b, scores.as<float>(), alibi_slopes, rows, seq);
    TWIN_CUDA_CHECK_LAUNCH();
    gemm(blas, plan_attention_output(shape), qkv_b, probs.as<bf16>(), out_b, CUDA_R_16BF, stream);
  }
}

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, int batch, int seq, int heads,
                        int head_dim, Cublas& blas, cudaStream_t stream, const float* alibi_slopes) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && heads > 0 && head_dim > 0);
  TWIN_CUDA_REQUIRE(static_cast<std::int64_t>(heads) * seq <= INT32_MAX);  // score rows of one sequence: int
  TWIN_CUDA_REQUIRE(dqkv != nullptr && dout != nullptr && qkv != nullptr && lse != nullptr);
  TWIN_CUDA_REQUIRE(dqkv != dout && dqkv != qkv);
  const AttentionShape shape{seq, heads, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t score_count = static_cast<std::size_t>(heads) * shape.scores_per_head();
  device::Scratch scores(score_count * sizeof(float), stream);  // (heads, seq, seq) S
  device::Scratch dprobs(score_count * sizeof(float), stream);  // dP
  device::Scratch probs(score_count * sizeof(bf16), stream);    // P
  device::Scratch dscores(score_count * sizeof(bf16), stream);  // dS, times the scale
  const int rows = heads * seq;
  for (int b = 0; b < batch; ++b) {
    const bf16* qkv_b = qkv + static_cast<std::size_t>(b) * seq * shape.qkv_row();
    const bf16* dout_b = dout + static_cast<std::size_t>(b) * seq * shape.hidden();
    bf16* dqkv_b = dqkv + static_cast<std::size_t>(b) * seq * shape.qkv_row();
    const float* lse_b = lse + static_cast<std::size_t>(b) * rows;
    gemm(blas, plan_attention_scores(shape, scale), qkv_b, qkv_b, scores.as<float>(), CUDA_R_32F, stream);
    gemm(blas, plan_attention_dprobs(shape), qkv_b, dout_b, dprobs.as<float>(), CUDA_R_32F, stream);
    causal_softmax_backward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        probs.as<bf16>(), dscores.as<bf16>(), scores.as<float>(), dprobs.as<float>(), lse_b, alibi_slopes, rows, seq,
        scale);
    TWIN_CUDA_CHECK_LAUNCH();
    gemm(blas, plan_attention_dvalue(shape), dout_b, probs.as<bf16>(), dqkv_b, CUDA_R_16BF, stream);
    gemm(blas, plan_attention_dquery(shape), qkv_b, dscores.as<bf16>(), dqkv_b, CUDA_R_16BF, stream);
    gemm(blas, plan_attention_dkey(shape), qkv_b, dscores.as<bf16>(), dqkv_b, CUDA_R_16BF, stream);
  }
}

void attention_forward_gqa(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                           int head_dim, Cublas& blas, cudaStream_t stream, const float* alibi_slopes) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  TWIN_CUDA_REQUIRE(heads % kv_heads == 0);
  if (kv_heads == heads) {  // multi-head attention: its path, its bits
    attention_forward(out, lse, qkv, batch, seq, heads, head_dim, blas, stream, alibi_slopes);
    return;
  }
  TWIN_CUDA_REQUIRE(static_cast<std::int64_t>(heads) * seq <= INT32_MAX);  // score rows of one sequence: int
  TWIN_CUDA_REQUIRE(out != nullptr && lse != nullptr && qkv != nullptr);
  TWIN_CUDA_REQUIRE(static_cast<const void*>(out) != static_cast<const void*>(qkv));
  const GroupedAttentionShape shape{seq, heads, kv_heads, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t score_count = static_cast<std::size_t>(heads) * shape.scores_per_head();
  device::Scratch scores(score_count * sizeof(float), stream);  // (heads, seq, seq)
  device::Scratch probs(score_count * sizeof(bf16), stream);    // (heads, seq, seq)
  const int rows = heads * seq;
  const int group = shape.group();
  for (int b = 0; b < batch; ++b) {
    const bf16* qkv_b = qkv + static_cast<std::size_t>(b) * seq * shape.qkv_row();
    bf16* out_b = out + static_cast<std::size_t>(b) * seq * shape.hidden();
    float* lse_b = lse + static_cast<std::size_t>(b) * rows;
    for (int j = 0; j < group; ++j) {  // query heads g group + j of every kv head g
      gemm(blas, plan_grouped_attention_scores(shape, j, scale), qkv_b, qkv_b, scores.as<float>(), CUDA_R_32F, stream);
    }
    causal_softmax_forward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        probs.as<bf16>(), lse_b, scores.as<float>(), alibi_slopes, rows, seq);
    TWIN_CUDA_CHECK_LAUNCH();
    for (int j = 0; j < group; ++j) {
      gemm(blas, plan_grouped_attention_output(shape, j), qkv_b, probs.as<bf16>(), out_b, CUDA_R_16BF, stream);
    }
  }
}

void attention_backward_gqa(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, int batch, int seq,
                            int heads, int kv_heads, int head_dim, Cublas& blas, cudaStream_t stream,
                            const float* alibi_slopes) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  TWIN_CUDA_REQUIRE(heads % kv_heads == 0);
  if (kv_heads == heads) {
    attention_backward(dqkv, dout, qkv, lse, batch, seq, heads, head_dim, blas, stream, alibi_slopes);
    return;
  }
  TWIN_CUDA_REQUIRE(static_cast<std::int64_t>(heads) * seq <= INT32_MAX);  // score rows of one sequence: int
  TWIN_CUDA_REQUIRE(dqkv != nullptr && dout != nullptr && qkv != nullptr && lse != nullptr);
  TWIN_CUDA_REQUIRE(dqkv != dout && dqkv != qkv);
  const GroupedAttentionShape shape{seq, heads, kv_heads, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::size_t score_count = static_cast<std::size_t>(heads) * shape.scores_per_head();
  const std::size_t kv_count = static_cast<std::size_t>(kv_heads) * shape.kv_sum_per_head();
  device::Scratch scores(score_count * sizeof(float), stream);  // (heads, seq, seq) S
  device::Scratch dprobs(score_count * sizeof(float), stream);  // dP
  device::Scratch probs(score_count * sizeof(bf16), stream);    // P
  device::Scratch dscores(score_count * sizeof(bf16), stream);  // dS, times the scale
  device::Scratch dk_sum(kv_count * sizeof(float), stream);     // (kv_heads, seq, head_dim), summed over each group
  device::Scratch dv_sum(kv_count * sizeof(float), stream);
  const int rows = heads * seq;
  const int group = shape.group();
  for (int b = 0; b < batch; ++b) {
    const bf16* qkv_b = qkv + static_cast<std::size_t>(b) * seq * shape.qkv_row();
    const bf16* dout_b = dout + static_cast<std::size_t>(b) * seq * shape.hidden();
    bf16* dqkv_b = dqkv + static_cast<std::size_t>(b) * seq * shape.qkv_row();
    const float* lse_b = lse + static_cast<std::size_t>(b) * rows;
    for (int j = 0; j < group; ++j) {
      gemm(blas, plan_grouped_attention_scores(shape, j, scale), qkv_b, qkv_b, scores.as<float>(), CUDA_R_32F, stream);
      gemm(blas, plan_grouped_attention_dprobs(shape, j), qkv_b, dout_b, dprobs.as<float>(), CUDA_R_32F, stream);
    }
    causal_softmax_backward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        probs.as<bf16>(), dscores.as<bf16>(), scores.as<float>(), dprobs.as<float>(), lse_b, alibi_slopes, rows, seq,
        scale);
    TWIN_CUDA_CHECK_LAUNCH();
    for (int j = 0; j < group; ++j) {  // j = 0 overwrites the sums, j > 0 adds to them: the group's heads in order
      gemm(blas, plan_grouped_attention_dvalue(shape, j), dout_b, probs.as<bf16>(), dv_sum.as<float>(), CUDA_R_32F,
           stream);
      gemm(blas, plan_grouped_attention_dquery(shape, j), qkv_b, dscores.as<bf16>(), dqkv_b, CUDA_R_16BF, stream);
      gemm(blas, plan_grouped_attention_dkey(shape, j), qkv_b, dscores.as<bf16>(), dk_sum.as<float>(), CUDA_R_32F,
           stream);
    }
    grouped_kv_gradient_kernel<<<launch::grid_stride_blocks(kv_count), launch::kElementwiseThreads, 0, stream>>>(
        dqkv_b, dk_sum.as<float>(), dv_sum.as<float>(), kv_count, seq, heads, kv_heads, head_dim);
    TWIN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace twin::kernels::cuda

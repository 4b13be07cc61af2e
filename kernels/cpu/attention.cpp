#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

using detail::dot;

void attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int head_dim) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(out != nullptr && lse != nullptr && qkv != nullptr);
  TWIN_KERNEL_CHECK(out != qkv);
  const std::size_t hidden = static_cast<std::size_t>(heads) * head_dim;  // H*D: one of q, k, v per token
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scores(static_cast<std::size_t>(seq));  // one row of scores, then of exp(score - max)

  for (int b = 0; b < batch; ++b) {
    const float* qkv_b = qkv + static_cast<std::size_t>(b) * seq * 3 * hidden;
    for (int h = 0; h < heads; ++h) {  // one head at a time: its k and v rows stay in cache across queries
      for (int t = 0; t < seq; ++t) {
        const float* q = qkv_b + static_cast<std::size_t>(t) * 3 * hidden + static_cast<std::size_t>(h) * head_dim;
        // s[t2] = scale * q . k_t2 for t2 <= t, and the row's max
        float max_score = -std::numeric_limits<float>::infinity();
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k =
              qkv_b + static_cast<std::size_t>(t2) * 3 * hidden + hidden + static_cast<std::size_t>(h) * head_dim;
          scores[t2] = scale * dot(q, k, head_dim);
          max_score = std::max(max_score, scores[t2]);
        }
        // e[t2] = exp(s[t2] - max), sum
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          scores[t2] = std::exp(scores[t2] - max_score);
          sum += scores[t2];
        }
        // out_t = sum_t2 (e[t2] / sum) v_t2
        const float inv_sum = 1.0f / sum;
        float* o = out + (static_cast<std::size_t>(b) * seq + t) * hidden + static_cast<std::size_t>(h) * head_dim;
        std::fill(o, o + head_dim, 0.0f);
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v =
              qkv_b + static_cast<std::size_t>(t2) * 3 * hidden + 2 * hidden + static_cast<std::size_t>(h) * head_dim;
          const float p = scores[t2] * inv_sum;
          for (int d = 0; d < head_dim; ++d) o[d] += p * v[d];
        }
        lse[(static_cast<std::size_t>(b) * heads + h) * seq + t] = max_score + std::log(sum);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int batch, int seq,
                        int heads, int head_dim) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && head_dim > 0);
  TWIN_KERNEL_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && lse != nullptr);
  TWIN_KERNEL_CHECK(dqkv != dout && dqkv != qkv);
  const std::size_t hidden = static_cast<std::size_t>(heads) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::fill(dqkv, dqkv + static_cast<std::size_t>(batch) * seq * 3 * hidden, 0.0f);
  std::vector<float> probs(static_cast<std::size_t>(seq));   // p[t2] of the current row
  std::vector<float> dprobs(static_cast<std::size_t>(seq));  // dL/dp[t2], then dL/ds[t2]

  for (int b = 0; b < batch; ++b) {
    const std::size_t batch_offset = static_cast<std::size_t>(b) * seq * 3 * hidden;
    const float* qkv_b = qkv + batch_offset;
    float* dqkv_b = dqkv + batch_offset;
    for (int h = 0; h < heads; ++h) {  // one head at a time: its k and v rows stay in cache across queries
      for (int t = 0; t < seq; ++t) {
        const std::size_t head_offset = static_cast<std::size_t>(h) * head_dim;
        const std::size_t q_offset = static_cast<std::size_t>(t) * 3 * hidden + head_offset;
        const float* q = qkv_b + q_offset;
        float* dq = dqkv_b + q_offset;
        const float* dy = dout + (static_cast<std::size_t>(b) * seq + t) * hidden + head_offset;
        const float row_lse = lse[(static_cast<std::size_t>(b) * heads + h) * seq + t];
        // p[t2] = exp(s[t2] - lse),  dp[t2] = dy . v_t2,  dv_t2 += p[t2] dy
        float p_dp = 0.0f;  // sum_t2 p[t2] dp[t2]
        for (int t2 = 0; t2 <= t; ++t2) {
          const std::size_t k_offset = static_cast<std::size_t>(t2) * 3 * hidden + hidden + head_offset;
          const float* k = qkv_b + k_offset;
          const float* v = qkv_b + k_offset + hidden;
          float* dv = dqkv_b + k_offset + hidden;
          probs[t2] = std::exp(scale * dot(q, k, head_dim) - row_lse);
          dprobs[t2] = dot(dy, v, head_dim);
          p_dp += probs[t2] * dprobs[t2];
          for (int d = 0; d < head_dim; ++d) dv[d] += probs[t2] * dy[d];
        }
        // softmax backward: ds[t2] = p[t2] (dp[t2] - sum p dp);  s = scale q.k  =>  dq += scale ds k, dk += scale ds q
        for (int t2 = 0; t2 <= t; ++t2) {
          const std::size_t k_offset = static_cast<std::size_t>(t2) * 3 * hidden + hidden + head_offset;
          const float* k = qkv_b + k_offset;
          float* dk = dqkv_b + k_offset;
          const float dscore = scale * probs[t2] * (dprobs[t2] - p_dp);
          for (int d = 0; d < head_dim; ++d) {
            dq[d] += dscore * k[d];
            dk[d] += dscore * q[d];
          }
        }
      }
    }
  }
}

}  // namespace twin::kernels::cpu

#include "kernels/cpu/rope.hpp"

#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/check.hpp"

namespace twin::kernels::cpu {

namespace {

// Rotates every q and k head vector of qkv by its position's angles, times `direction` (+1 forward, -1 backward):
// sin(-a) = -sin(a), so the backward uses the forward's very cos and sin, the sign of sin flipped, and is the exact
// transpose of its fp32 rotation.
void rotate_q_and_k(float* qkv, int batch, int seq, int heads, int kv_heads, int head_dim, float base, int rotary_dim,
                    int first_position, double direction) {
  const int half = rotary_dim / 2;
  const std::size_t row = static_cast<std::size_t>(heads + 2 * kv_heads) * head_dim;  // floats per token
  const int rotated_heads = heads + kv_heads;  // q's heads, then k's, contiguous at the start of each row
  std::vector<double> theta(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) theta[i] = std::pow(static_cast<double>(base), -2.0 * i / rotary_dim);
  std::vector<float> cos_angle(static_cast<std::size_t>(half)), sin_angle(static_cast<std::size_t>(half));
  for (int t = 0; t < seq; ++t) {
    // this position's cos and sin, in double, rounded once: the same for every batch element and head
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(first_position + t) * theta[i];
      cos_angle[i] = static_cast<float>(std::cos(angle));
      sin_angle[i] = static_cast<float>(direction * std::sin(angle));
    }
    for (int b = 0; b < batch; ++b) {
      float* token = qkv + (static_cast<std::size_t>(b) * seq + t) * row;
      for (int h = 0; h < rotated_heads; ++h) {
        float* x1 = token + static_cast<std::size_t>(h) * head_dim;
        float* x2 = x1 + half;
        for (int i = 0; i < half; ++i) {
          const float x1_i = x1[i], x2_i = x2[i];
          x1[i] = x1_i * cos_angle[i] - x2_i * sin_angle[i];
          x2[i] = x2_i * cos_angle[i] + x1_i * sin_angle[i];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* qkv, int batch, int seq, int heads, int kv_heads, int head_dim, float base, int rotary_dim,
                  int first_position) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  if (rotary_dim == 0) rotary_dim = head_dim;
  TWIN_KERNEL_CHECK(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0);
  TWIN_KERNEL_CHECK(std::isfinite(base) && base > 0.0f);
  TWIN_KERNEL_CHECK(qkv != nullptr && first_position >= 0);
  rotate_q_and_k(qkv, batch, seq, heads, kv_heads, head_dim, base, rotary_dim, first_position, 1.0);
}

void rope_backward(float* dqkv, int batch, int seq, int heads, int kv_heads, int head_dim, float base, int rotary_dim,
                   int first_position) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  if (rotary_dim == 0) rotary_dim = head_dim;
  TWIN_KERNEL_CHECK(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0);
  TWIN_KERNEL_CHECK(std::isfinite(base) && base > 0.0f);
  TWIN_KERNEL_CHECK(dqkv != nullptr && first_position >= 0);
  rotate_q_and_k(dqkv, batch, seq, heads, kv_heads, head_dim, base, rotary_dim, first_position, -1.0);
}

}  // namespace twin::kernels::cpu

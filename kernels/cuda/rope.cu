#include "kernels/cuda/rope.cuh"

#include <cmath>
#include <cstddef>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// Pair e of n = batch * seq * (heads + kv_heads) * half (half = rotary_dim / 2): e = ((token * rotated_heads) + h) *
// half + i, token = b * seq + t, h in [0, heads + kv_heads) (q's heads, then k's: contiguous at the start of each
// row). The thread rotates (x[i], x[i + half]) of head h of its token by position t's angle i, times `direction` (+1
// forward, -1 backward). Pairs are disjoint: in place is safe.
__global__ void rope_kernel(bf16* qkv, std::size_t n, int seq, int rotated_heads, std::size_t row, int head_dim,
                            int rotary_dim, float base, double direction) {
  const int half = rotary_dim / 2;
  TWIN_GRID_STRIDE_LOOP(e, n) {
    const int i = static_cast<int>(e % static_cast<std::size_t>(half));
    const std::size_t rest = e / static_cast<std::size_t>(half);
    const int h = static_cast<int>(rest % static_cast<std::size_t>(rotated_heads));
    const std::size_t token = rest / static_cast<std::size_t>(rotated_heads);
    const int t = static_cast<int>(token % static_cast<std::size_t>(seq));
    float cos_angle = 0.0f, sin_angle = 0.0f;
    math::rope_cos_sin(t, i, rotary_dim, base, direction, &cos_angle, &sin_angle);
    bf16* x1 = qkv + token * row + static_cast<std::size_t>(h) * head_dim + i;
    bf16* x2 = x1 + half;
    float a = __bfloat162float(*x1), b = __bfloat162float(*x2);
    math::rope_rotate(a, b, cos_angle, sin_angle);
    *x1 = __float2bfloat16_rn(a);
    *x2 = __float2bfloat16_rn(b);
  }
}

void rope(bf16* qkv, int batch, int seq, int heads, int kv_heads, int head_dim, int rotary_dim, float base,
          double direction, cudaStream_t stream) {
  const int rotated_heads = heads + kv_heads;
  const std::size_t row = static_cast<std::size_t>(heads + 2 * kv_heads) * head_dim;  // elements per token
  const std::size_t n = static_cast<std::size_t>(batch) * seq * rotated_heads * (rotary_dim / 2);
  rope_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(
      qkv, n, seq, rotated_heads, row, head_dim, rotary_dim, base, direction);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(bf16* qkv, int batch, int seq, int heads, int kv_heads, int head_dim, cudaStream_t stream,
                  float base, int rotary_dim) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  if (rotary_dim == 0) rotary_dim = head_dim;
  TWIN_CUDA_REQUIRE(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0);
  TWIN_CUDA_REQUIRE(std::isfinite(base) && base > 0.0f);
  TWIN_CUDA_REQUIRE(qkv != nullptr);
  rope(qkv, batch, seq, heads, kv_heads, head_dim, rotary_dim, base, 1.0, stream);
}

void rope_backward(bf16* dqkv, int batch, int seq, int heads, int kv_heads, int head_dim, cudaStream_t stream,
                   float base, int rotary_dim) {
  TWIN_CUDA_REQUIRE(batch > 0 && seq > 0 && heads > 0 && kv_heads > 0 && head_dim > 0);
  if (rotary_dim == 0) rotary_dim = head_dim;
  TWIN_CUDA_REQUIRE(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0);
  TWIN_CUDA_REQUIRE(std::isfinite(base) && base > 0.0f);
  TWIN_CUDA_REQUIRE(dqkv != nullptr);
  rope(dqkv, batch, seq, heads, kv_heads, head_dim, rotary_dim, base, -1.0, stream);
}

}  // namespace twin::kernels::cuda

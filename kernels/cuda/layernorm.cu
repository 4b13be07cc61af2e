#include "kernels/cuda/layernorm.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/norm_rows.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;
using device::warp_sum;

namespace {

// One warp normalizes one row x (channels) into y; lane l handles channels l, l + 32, ... in every pass. Two passes
// for the statistics (mean, then the variance around it: no cancellation), a third writes y.
__device__ void layernorm_row(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* weight, const bf16* bias,
                              int channels, int lane) {
  float sum = 0.0f;
  for (int c = lane; c < channels; c += 32) sum += __bfloat162float(x[c]);
  const float m = warp_sum(sum) / static_cast<float>(channels);
  float sum_squares = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    const float d = __bfloat162float(x[c]) - m;
    sum_squares += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(sum_squares) / static_cast<float>(channels) + kLayerNormEps);
  for (int c = lane; c < channels; c += 32) {
    const float norm = (__bfloat162float(x[c]) - m) * s;
    y[c] = __float2bfloat16_rn(norm * __bfloat162float(weight[c]) + __bfloat162float(bias[c]));
  }
  if (lane == 0) {
    *mean = m;
    *rstd = s;
  }
}

// row = blockIdx.x * kWarpsPerRowBlock + warp
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                                         const bf16* bias, int rows, int channels) {
  const int row = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves: no block-wide barrier follows
  const std::size_t offset = static_cast<std::size_t>(row) * channels;
  layernorm_row(out + offset, mean + row, rstd + row, inp + offset, weight, bias, channels, threadIdx.x % 32);
}

// residual = a + b (bf16), then the LayerNorm of the rounded residual
__global__ void residual_layernorm_forward_kernel(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                                  const bf16* b, const bf16* weight, const bf16* bias, int rows,
                                                  int channels) {
  const int row = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const std::size_t offset = static_cast<std::size_t>(row) * channels;
  for (int c = lane; c < channels; c += 32) {
    residual[offset + c] = __float2bfloat16_rn(__bfloat162float(a[offset + c]) + __bfloat162float(b[offset + c]));
  }
  __syncwarp();  // the row is complete and visible to the whole warp
  layernorm_row(out + offset, mean + row, rstd + row, residual + offset, weight, bias, channels, lane);
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)),  dnorm = dout * weight,  one warp per row
__global__ void layernorm_backward_input_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                                const float* mean, const float* rstd, int rows, int channels) {
  const int row = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const std::size_t offset = static_cast<std::size_t>(row) * channels;
  const bf16* x = inp + offset;
  const bf16* dy = dout + offset;
  bf16* dx = dinp + offset;
  const float m = mean[row];
  const float s = rstd[row];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    const float dnorm = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * ((__bfloat162float(x[c]) - m) * s);
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(channels);
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(channels);
  for (int c = lane; c < channels; c += 32) {
    const float norm = (__bfloat162float(x[c]) - m) * s;
    const float dnorm = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
    const float delta = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) + delta);
  }
}

// --- one block per row, read once (norm_rows.cuh), for rows of launch::norm_threads ----------------------------------

// out = LayerNorm(x), x = inp, or (Residual) residual = a + b rounded to bf16 and x = residual
template <bool Residual>
__global__ void layernorm_row_block_kernel(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                           const bf16* b, const bf16* weight, const bf16* bias, int channels) {
  __shared__ float shared[32];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * channels;
  device::RowPacks x;
  x.load(a + offset, channels);
  if constexpr (Residual) {
    device::RowPacks y;
    y.load(b + offset, channels);
#pragma unroll
    for (int k = 0; k < launch::kNormPacks; ++k) {
      if (x.column(k) >= channels) continue;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x.pack[k].v[e] = __float2bfloat16_rn(__bfloat162float(x.pack[k].v[e]) + __bfloat162float(y.pack[k].v[e]));
      }
      device::store_pack(residual + offset + x.column(k), x.pack[k]);
    }
  }
  const float n = static_cast<float>(channels);
  const float m = device::block_sum(x.sum(channels, [](int, float v) { return v; }), shared) / n;
  const float variance =
      device::block_sum(x.sum(channels, [m](int, float v) { return (v - m) * (v - m); }), shared) / n;
  const float s = 1.0f / sqrtf(variance + kLayerNormEps);
#pragma unroll
  for (int k = 0; k < launch::kNormPacks; ++k) {
    const int c = x.column(k);
    if (c >= channels) continue;
    const device::Pack<bf16> w = device::load_pack(weight + c), bb = device::load_pack(bias + c);
    device::Pack<bf16> y;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float norm = (__bfloat162float(x.pack[k].v[e]) - m) * s;
      y.v[e] = __float2bfloat16_rn(norm * __bfloat162float(w.v[e]) + __bfloat162float(bb.v[e]));
    }
    device::store_pack(out + offset + c, y);
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), one block per row
__global__ void layernorm_backward_row_block_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                                    const float* mean, const float* rstd, int channels) {
  __shared__ float shared[32];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * channels;
  device::RowPacks x, dy, w;
  x.load(inp + offset, channels);
  dy.load(dout + offset, channels);
  w.load(weight, channels);
  const float m = mean[blockIdx.x], s = rstd[blockIdx.x], n = static_cast<float>(channels);
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
  for (int k = 0; k < launch::kNormPacks; ++k) {
    if (x.column(k) >= channels) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float dnorm = __bfloat162float(dy.pack[k].v[e]) * __bfloat162float(w.pack[k].v[e]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * ((__bfloat162float(x.pack[k].v[e]) - m) * s);
    }
  }
  const float dnorm_mean = device::block_sum(dnorm_sum, shared) / n;
  const float dnorm_norm_mean = device::block_sum(dnorm_norm_sum, shared) / n;
#pragma unroll
  for (int k = 0; k < launch::kNormPacks; ++k) {
    const int c = x.column(k);
    if (c >= channels) continue;
    device::Pack<bf16> dx = device::load_pack(dinp + offset + c);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float norm = (__bfloat162float(x.pack[k].v[e]) - m) * s;
      const float dnorm = __bfloat162float(dy.pack[k].v[e]) * __bfloat162float(w.pack[k].v[e]);
      const float delta = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      dx.v[e] = __float2bfloat16_rn(__bfloat162float(dx.v[e]) + delta);
    }
    device::store_pack(dinp + offset + c, dx);
  }
}

// terms of the weight and bias gradients: (dout * norm, dout) at (r, c)
struct LayerNormWeightGradientTerm {
  const bf16* dout;
  const bf16* inp;
  const float* mean;
  const float* rstd;
  int channels;
  __device__ float2 operator()(int r, int c) const {
    const std::size_t i = static_cast<std::size_t>(r) * channels + c;
    const float dy = __bfloat162float(dout[i]);
    const float norm = (__bfloat162float(inp[i]) - mean[r]) * rstd[r];
    return make_float2(dy * norm, dy);
  }
};

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && mean != nullptr && rstd != nullptr);
  TWIN_CUDA_REQUIRE(inp != nullptr && weight != nullptr && bias != nullptr);
  TWIN_CUDA_REQUIRE(out != inp);
  if (const int threads = launch::norm_threads(channels); threads > 0 && device::aligned_16({out, inp, weight, bias})) {
    layernorm_row_block_kernel<false>
        <<<rows, threads, 0, stream>>>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, channels);
    TWIN_CUDA_CHECK_LAUNCH();
    return;
  }
  layernorm_forward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, rows, channels);
  TWIN_CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                const bf16* weight, const bf16* bias, int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(residual != nullptr && out != nullptr && mean != nullptr && rstd != nullptr);
  TWIN_CUDA_REQUIRE(a != nullptr && b != nullptr && weight != nullptr && bias != nullptr);
  TWIN_CUDA_REQUIRE(out != residual && out != a && out != b);
  if (const int threads = launch::norm_threads(channels);
      threads > 0 && device::aligned_16({residual, out, a, b, weight, bias})) {
    layernorm_row_block_kernel<true>
        <<<rows, threads, 0, stream>>>(residual, out, mean, rstd, a, b, weight, bias, channels);
    TWIN_CUDA_CHECK_LAUNCH();
    return;
  }
  residual_layernorm_forward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
      residual, out, mean, rstd, a, b, weight, bias, rows, channels);
  TWIN_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                        const float* mean, const float* rstd, int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(dinp != nullptr && dweight != nullptr && dbias != nullptr);
  TWIN_CUDA_REQUIRE(dout != nullptr && inp != nullptr && weight != nullptr && mean != nullptr && rstd != nullptr);
  TWIN_CUDA_REQUIRE(dinp != dout && dinp != inp);
  if (const int threads = launch::norm_threads(channels);
      threads > 0 && device::aligned_16({dinp, dout, inp, weight})) {
    layernorm_backward_row_block_kernel<<<rows, threads, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, channels);
  } else {
    layernorm_backward_input_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, rows, channels);
  }
  TWIN_CUDA_CHECK_LAUNCH();
  device::column_sums<2>(dweight, dbias, LayerNormWeightGradientTerm{dout, inp, mean, rstd, channels}, rows, channels,
                         stream);
}

}  // namespace twin::kernels::cuda

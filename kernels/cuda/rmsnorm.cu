#include "kernels/cuda/rmsnorm.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/norm_rows.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;
using device::warp_sum;

namespace {

// One warp normalizes one row x (channels) into y; lane l handles channels l, l + 32, ... in every pass. A sum of
// squares has no cancellation: one pass for the statistic, a second writes y.
//   rstd = 1 / sqrt(sum x^2 / channels + eps),   y = (x rstd) weight
// row = blockIdx.x * kWarpsPerRowBlock + warp
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int rows,
                                       int channels) {
  const int row = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves: no block-wide barrier follows
  const int lane = threadIdx.x % 32;
  const std::size_t offset = static_cast<std::size_t>(row) * channels;
  const bf16* x = inp + offset;
  bf16* y = out + offset;
  float sum_squares = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    const float v = __bfloat162float(x[c]);
    sum_squares += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(sum_squares) / static_cast<float>(channels) + kRmsNormEps);
  for (int c = lane; c < channels; c += 32) {
    y[c] = __float2bfloat16_rn(__bfloat162float(x[c]) * s * __bfloat162float(weight[c]));
  }
  if (lane == 0) rstd[row] = s;
}

// dinp += rstd * (dnorm - norm * mean(dnorm * norm)),  norm = inp * rstd,  dnorm = dout * weight,  one warp per row
// (LayerNorm's formula without its mean(dnorm) term: no mean was subtracted)
__global__ void rmsnorm_backward_input_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                              const float* rstd, int rows, int channels) {
  const int row = blockIdx.x * launch::kWarpsPerRowBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const std::size_t offset = static_cast<std::size_t>(row) * channels;
  const bf16* x = inp + offset;
  const bf16* dy = dout + offset;
  bf16* dx = dinp + offset;
  const float s = rstd[row];
  float dnorm_norm_sum = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    const float dnorm = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
    dnorm_norm_sum += dnorm * (__bfloat162float(x[c]) * s);
  }
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(channels);
  for (int c = lane; c < channels; c += 32) {
    const float norm = __bfloat162float(x[c]) * s;
    const float dnorm = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
    const float delta = (dnorm - norm * dnorm_norm_mean) * s;
    dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) + delta);
  }
}

// --- one block per row, read once (norm_rows.cuh), for rows of launch::norm_threads ----------------------------------

__global__ void rmsnorm_row_block_kernel(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int channels) {
  __shared__ float shared[32];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * channels;
  device::RowPacks x;
  x.load(inp + offset, channels);
  const float sum_squares = device::block_sum(x.sum(channels, [](int, float v) { return v * v; }), shared);
  const float s = 1.0f / sqrtf(sum_squares / static_cast<float>(channels) + kRmsNormEps);
#pragma unroll
  for (int k = 0; k < launch::kNormPacks; ++k) {
    const int c = x.column(k);
    if (c >= channels) continue;
    const device::Pack<bf16> w = device::load_pack(weight + c);
    device::Pack<bf16> y;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      y.v[e] = __float2bfloat16_rn(__bfloat162float(x.pack[k].v[e]) * s * __bfloat162float(w.v[e]));
    }
    device::store_pack(out + offset + c, y);
  }
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
}

__global__ void rmsnorm_backward_row_block_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* weight,
                                                  const float* rstd, int channels) {
  __shared__ float shared[32];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * channels;
  device::RowPacks x, dy, w;
  x.load(inp + offset, channels);
  dy.load(dout + offset, channels);
  w.load(weight, channels);
  const float s = rstd[blockIdx.x];
  float dnorm_norm_sum = 0.0f;
#pragma unroll
  for (int k = 0; k < launch::kNormPacks; ++k) {
    if (x.column(k) >= channels) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float dnorm = __bfloat162float(dy.pack[k].v[e]) * __bfloat162float(w.pack[k].v[e]);
      dnorm_norm_sum += dnorm * (__bfloat162float(x.pack[k].v[e]) * s);
    }
  }
  const float dnorm_norm_mean = device::block_sum(dnorm_norm_sum, shared) / static_cast<float>(channels);
#pragma unroll
  for (int k = 0; k < launch::kNormPacks; ++k) {
    const int c = x.column(k);
    if (c >= channels) continue;
    device::Pack<bf16> dx = device::load_pack(dinp + offset + c);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float norm = __bfloat162float(x.pack[k].v[e]) * s;
      const float dnorm = __bfloat162float(dy.pack[k].v[e]) * __bfloat162float(w.pack[k].v[e]);
      dx.v[e] = __float2bfloat16_rn(__bfloat162float(dx.v[e]) + (dnorm - norm * dnorm_norm_mean) * s);
    }
    device::store_pack(dinp + offset + c, dx);
  }
}

// the term of the weight gradient at (r, c): dout * norm (the second output of column_sums is unused)
struct RmsNormWeightGradientTerm {
  const bf16* dout;
  const bf16* inp;
  const float* rstd;
  int channels;
  __device__ float2 operator()(int r, int c) const {
    const std::size_t i = static_cast<std::size_t>(r) * channels + c;
    const float norm = __bfloat162float(inp[i]) * rstd[r];
    return make_float2(__bfloat162float(dout[i]) * norm, 0.0f);
  }
};

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int rows, int channels,
                     cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && rstd != nullptr && inp != nullptr && weight != nullptr);
  TWIN_CUDA_REQUIRE(out != inp);
  if (const int threads = launch::norm_threads(channels); threads > 0 && device::aligned_16({out, inp, weight})) {
    rmsnorm_row_block_kernel<<<rows, threads, 0, stream>>>(out, rstd, inp, weight, channels);
  } else {
    rmsnorm_forward_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        out, rstd, inp, weight, rows, channels);
  }
  TWIN_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(dinp != nullptr && dweight != nullptr);
  TWIN_CUDA_REQUIRE(dout != nullptr && inp != nullptr && weight != nullptr && rstd != nullptr);
  TWIN_CUDA_REQUIRE(dinp != dout && dinp != inp);
  if (const int threads = launch::norm_threads(channels);
      threads > 0 && device::aligned_16({dinp, dout, inp, weight})) {
    rmsnorm_backward_row_block_kernel<<<rows, threads, 0, stream>>>(dinp, dout, inp, weight, rstd, channels);
  } else {
    rmsnorm_backward_input_kernel<<<launch::row_blocks(rows), 32 * launch::kWarpsPerRowBlock, 0, stream>>>(
        dinp, dout, inp, weight, rstd, rows, channels);
  }
  TWIN_CUDA_CHECK_LAUNCH();
  // deterministic column sums (reduce.cuh): chunks of rows in order, as layernorm_backward's weight gradient
  device::column_sums<1>(dweight, nullptr, RmsNormWeightGradientTerm{dout, inp, rstd, channels}, rows, channels,
                         stream);
}

}  // namespace twin::kernels::cuda

#include "kernels/cuda/cast.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// out[i] = bf16(inp[i])
__global__ void cast_float_to_bf16_kernel(bf16* out, const float* inp, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = __float2bfloat16_rn(inp[i]);
  }
}

// out[i] = fp32(inp[i])
__global__ void cast_bf16_to_float_kernel(float* out, const bf16* inp, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = __bfloat162float(inp[i]);
  }
}

// out[i] = fp32(bf16(inp[i]))
__global__ void round_to_bf16_kernel(float* out, const float* inp, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = __bfloat162float(__float2bfloat16_rn(inp[i]));
  }
}

}  // namespace

void cast_float_to_bf16(bf16* out, const float* inp, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && inp != nullptr));
  if (n == 0) return;
  cast_float_to_bf16_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

void cast_bf16_to_float(float* out, const bf16* inp, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && inp != nullptr));
  if (n == 0) return;
  cast_bf16_to_float_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

void round_to_bf16(float* out, const float* inp, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && inp != nullptr));
  if (n == 0) return;
  round_to_bf16_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda

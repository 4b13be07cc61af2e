#include "kernels/cuda/gelu.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// out[i] = gelu(inp[i])
__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = __float2bfloat16_rn(math::gelu(__bfloat162float(inp[i])));
  }
}

// dinp[i] = gelu'(inp[i]) * dout[i]
__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    dinp[i] = __float2bfloat16_rn(math::gelu_grad(__bfloat162float(inp[i])) * __bfloat162float(dout[i]));
  }
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && inp != nullptr));
  if (n == 0) return;
  gelu_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (dinp != nullptr && inp != nullptr && dout != nullptr));
  if (n == 0) return;
  gelu_backward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(dinp, inp, dout, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda

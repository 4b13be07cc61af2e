#include "kernels/cuda/swiglu.cuh"

#include <cstddef>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// element i = r * width + c of out:  out[r, c] = swiglu(inp[r, c], inp[r, width + c])
__global__ void swiglu_forward_kernel(bf16* out, const bf16* inp, std::size_t n, int width) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    const std::size_t r = i / static_cast<std::size_t>(width), c = i % static_cast<std::size_t>(width);
    const bf16* gate = inp + r * 2 * static_cast<std::size_t>(width);
    out[i] = __float2bfloat16_rn(math::swiglu(__bfloat162float(gate[c]), __bfloat162float(gate[width + c])));
  }
}

// element i = r * width + c of dout:  dinp[r, c] = d gate,  dinp[r, width + c] = d up
__global__ void swiglu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, int width) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    const std::size_t r = i / static_cast<std::size_t>(width), c = i % static_cast<std::size_t>(width);
    const std::size_t row = r * 2 * static_cast<std::size_t>(width);
    const float g = __bfloat162float(inp[row + c]);
    const float up = __bfloat162float(inp[row + width + c]);
    const float dy = __bfloat162float(dout[i]);
    dinp[row + c] = __float2bfloat16_rn(math::swiglu_dgate(g, up, dy));
    dinp[row + width + c] = __float2bfloat16_rn(math::swiglu_dup(g, dy));
  }
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* inp, int rows, int width, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && width > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr);
  TWIN_CUDA_REQUIRE(out != inp);
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
  swiglu_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n, width);
  TWIN_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int rows, int width, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && width > 0);
  TWIN_CUDA_REQUIRE(dinp != nullptr && inp != nullptr && dout != nullptr);
  TWIN_CUDA_REQUIRE(dinp != inp && dinp != dout);
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
  swiglu_backward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(dinp, inp, dout, n,
                                                                                                    width);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda

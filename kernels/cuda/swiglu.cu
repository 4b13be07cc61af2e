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

// The same, 8 columns at a time (width a multiple of 8, 16-byte aligned pointers): pack p covers out[r, c .. c + 8)
__global__ void swiglu_forward_packed_kernel(bf16* out, const bf16* inp, std::size_t packs, int width) {
  TWIN_GRID_STRIDE_LOOP(p, packs) {
    const std::size_t i = p * 8, r = i / static_cast<std::size_t>(width), c = i % static_cast<std::size_t>(width);
    const bf16* gate = inp + r * 2 * static_cast<std::size_t>(width) + c;
    const device::Pack<bf16> g = device::load_pack(gate), up = device::load_pack(gate + width);
    device::Pack<bf16> y;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      y.v[e] = __float2bfloat16_rn(math::swiglu(__bfloat162float(g.v[e]), __bfloat162float(up.v[e])));
    device::store_pack(out + i, y);
  }
}

__global__ void swiglu_backward_packed_kernel(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t packs,
                                              int width) {
  TWIN_GRID_STRIDE_LOOP(p, packs) {
    const std::size_t i = p * 8, r = i / static_cast<std::size_t>(width), c = i % static_cast<std::size_t>(width);
    const std::size_t row = r * 2 * static_cast<std::size_t>(width);
    const device::Pack<bf16> g = device::load_pack(inp + row + c), up = device::load_pack(inp + row + width + c);
    const device::Pack<bf16> dy = device::load_pack(dout + i);
    device::Pack<bf16> dgate, dup;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float gv = __bfloat162float(g.v[e]), uv = __bfloat162float(up.v[e]), dv = __bfloat162float(dy.v[e]);
      dgate.v[e] = __float2bfloat16_rn(math::swiglu_dgate(gv, uv, dv));
      dup.v[e] = __float2bfloat16_rn(math::swiglu_dup(gv, dv));
    }
    device::store_pack(dinp + row + c, dgate);
    device::store_pack(dinp + row + width + c, dup);
  }
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* inp, int rows, int width, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && width > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr);
  TWIN_CUDA_REQUIRE(out != inp);
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
  if (width % 8 == 0 && device::aligned_16({out, inp})) {
    swiglu_forward_packed_kernel<<<launch::grid_stride_blocks(n / 8), launch::kElementwiseThreads, 0, stream>>>(
        out, inp, n / 8, width);
    TWIN_CUDA_CHECK_LAUNCH();
    return;
  }
  swiglu_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n, width);
  TWIN_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dinp, const bf16* inp, const bf16* dout, int rows, int width, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && width > 0);
  TWIN_CUDA_REQUIRE(dinp != nullptr && inp != nullptr && dout != nullptr);
  TWIN_CUDA_REQUIRE(dinp != inp && dinp != dout);
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
  if (width % 8 == 0 && device::aligned_16({dinp, inp, dout})) {
    swiglu_backward_packed_kernel<<<launch::grid_stride_blocks(n / 8), launch::kElementwiseThreads, 0, stream>>>(
        dinp, inp, dout, n / 8, width);
    TWIN_CUDA_CHECK_LAUNCH();
    return;
  }
  swiglu_backward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(dinp, inp, dout, n,
                                                                                                    width);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda

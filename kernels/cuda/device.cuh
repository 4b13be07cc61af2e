// Internal to kernels/cuda/*.cu (nvcc only): element conversions, warp and block reductions with a fixed order, and
// the grid-stride loop. Every reduction here combines its terms in an order fixed by the launch shape alone, never by
// timing, so every kernel of this folder is deterministic: same inputs, same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/launch.hpp"

namespace twin::kernels::cuda::device {

using bf16 = __nv_bfloat16;

// --- element conversions: fp32 arithmetic on fp32 or bf16 storage --------------------------------------------------
__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// --- reductions
// ------------------------------------------------------------------------------------------------------- Butterfly
// over the 32 lanes of a warp (all lanes active): every lane gets the same result, same order every time.
template <class T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024, every thread calling): warp sums, then warp 0 sums
// the warps' results. Returns the total in every thread. `shared` holds 32 values of T.
template <class T>
__device__ T block_sum(T x, T* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  total = warp_sum(total);  // every warp computes the same total from the same values
  return total;
}

// Grid-stride loop over [0, n): for (std::size_t i : grid_stride(n)) ... is spelled with this macro for clarity.
#define TWIN_GRID_STRIDE_LOOP(i, n)                                                              \
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

}  // namespace twin::kernels::cuda::device

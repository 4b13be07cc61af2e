// Internal to kernels/cuda/*.cu (nvcc only): element conversions, warp and block reductions with a fixed order, and
// the grid-stride loop. Every reduction here combines its terms in an order fixed by the launch shape alone, never by
// timing, so every kernel of this folder is deterministic: same inputs, same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/check.cuh"
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

// --- 16-byte packs: element-wise kernels move 8 bf16 or 4 fp32 per load and store -----------------------------------
template <class T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};
template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {  // p 16-byte aligned
  Pack<T> x;
  *reinterpret_cast<uint4*>(x.v) = *reinterpret_cast<const uint4*>(p);
  return x;
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(x.v);
}
// true when every pointer is 16-byte aligned (host side: whether a kernel may take the packed path)
inline bool aligned_16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// out[i] = op(i, x0[i], x1[i]) for i < n, in fp32 on T storage; the inputs past `Inputs` are not read (0 is passed).
// Packed (every pointer 16-byte aligned, as launch_map checks): 16 bytes at a time, then the tail element by element.
// Each element's value depends on its inputs alone: packed or not, the same bits.
template <int Inputs, class T, class Op>
__global__ void map_kernel(T* out, const T* x0, const T* x1, std::size_t n, Op op, bool packed) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  constexpr int K = Pack<T>::kSize;
  std::size_t done = 0;
  if (packed) {
    const std::size_t packs = n / K;
    for (std::size_t p = first; p < packs; p += stride) {
      Pack<T> a{}, b{}, o;
      if constexpr (Inputs >= 1) a = load_pack(x0 + p * K);
      if constexpr (Inputs >= 2) b = load_pack(x1 + p * K);
#pragma unroll
      for (int k = 0; k < K; ++k) o.v[k] = from_float<T>(op(p * K + k, to_float(a.v[k]), to_float(b.v[k])));
      store_pack(out + p * K, o);
    }
    done = packs * K;
  }
  for (std::size_t i = done + first; i < n; i += stride) {
    const float a = Inputs >= 1 ? to_float(x0[i]) : 0.0f, b = Inputs >= 2 ? to_float(x1[i]) : 0.0f;
    out[i] = from_float<T>(op(i, a, b));
  }
}

template <int Inputs, class T, class Op>
void launch_map(T* out, const T* x0, const T* x1, std::size_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  const bool packed = aligned_16({out, x0, x1});
  const std::size_t work = packed ? n / Pack<T>::kSize + n % Pack<T>::kSize : n;
  map_kernel<Inputs>
      <<<launch::grid_stride_blocks(work), launch::kElementwiseThreads, 0, stream>>>(out, x0, x1, n, op, packed);
  TWIN_CUDA_CHECK_LAUNCH();
}

// Grid-stride loop over [0, n): for (std::size_t i : grid_stride(n)) ... is spelled with this macro for clarity.
#define TWIN_GRID_STRIDE_LOOP(i, n)                                                              \
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

}  // namespace twin::kernels::cuda::device

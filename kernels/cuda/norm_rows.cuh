// Internal to layernorm.cu and rmsnorm.cu (nvcc only): one block per row, the row read once into registers.
// Thread i of the block holds packs i, i + blockDim.x, ... (at most launch::kNormPacks) of 8 bf16 each (16-byte loads);
// the statistics are block sums (device::block_sum: an order fixed by the launch shape, so deterministic) over those
// registers, never a second read of the row. launch::norm_threads says which rows fit.
#pragma once

#include "kernels/cuda/device.cuh"

namespace twin::kernels::cuda::device {

struct RowPacks {
  Pack<bf16> pack[launch::kNormPacks];

  // column of this thread's pack k (>= channels: the thread holds no such pack)
  __device__ static int column(int k) { return (k * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * 8; }

  __device__ void load(const bf16* row, int channels) {
#pragma unroll
    for (int k = 0; k < launch::kNormPacks; ++k) {
      if (column(k) < channels) pack[k] = load_pack(row + column(k));
    }
  }
  // sum over this thread's elements of f(column, value)
  template <class F>
  __device__ float sum(int channels, F f) const {
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < launch::kNormPacks; ++k) {
      if (column(k) >= channels) continue;
#pragma unroll
      for (int e = 0; e < 8; ++e) total += f(column(k) + e, __bfloat162float(pack[k].v[e]));
    }
    return total;
  }
};

}  // namespace twin::kernels::cuda::device

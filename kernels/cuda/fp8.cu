// FP8 kernels: every element goes through fp8_math.hpp (the formulas the host tests check against kernels/cpu).
// Amaxes are maxima of the magnitudes' bit patterns (for non-negative floats the integer order is the float order,
// and a NaN's bits exceed infinity's, so a NaN wins as kernels/cpu's absolute_max makes it win).
#include "kernels/cuda/fp8.cuh"

#include <algorithm>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/matmul.cuh"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

constexpr int kWarpsPerBlock = 8;  // 256 threads: one tile per warp
constexpr int kTransposeTile = 32;
constexpr int kTransposeRows = 8;  // a 32 x 32 tile by 32 x 8 threads

__device__ __forceinline__ unsigned magnitude_bits(bf16 x) {
  return math::bits_of(__bfloat162float(x)) & 0x7fffffffu;
}

// --- amax and per-tensor scales -------------------------------------------------------------------------------------
__global__ void absolute_max_kernel(float* amax, const bf16* x, std::size_t n) {
  unsigned local = 0;
  TWIN_GRID_STRIDE_LOOP(i, n) {
    local = max(local, magnitude_bits(x[i]));
  }
  local = __reduce_max_sync(0xffffffffu, local);
  if (threadIdx.x % 32 == 0 && local != 0) atomicMax(reinterpret_cast<unsigned*>(amax), local);
}

__global__ void tensor_scale_kernel(float* scale, float* scale_inverse, const float* amax, float given_scale,
                                    Fp8Format format) {
  const float s = amax != nullptr ? fp8::scale_from_amax(*amax, fp8::fp8_max(format), 1.0f) : given_scale;
  *scale = s;
  *scale_inverse = math::div_rn(1.0f, s);
}

// --- per-tensor quantization ----------------------------------------------------------------------------------------
__global__ void quantize_kernel(std::uint8_t* out, const bf16* inp, std::size_t n, const float* scale,
                                Fp8Format format) {
  const float s = *scale;
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = fp8::float_to_fp8(math::mul_rn(__bfloat162float(inp[i]), s), format);
  }
}

// Block (32, 8) quantizes the 32 x 32 tile at (blockIdx.y, blockIdx.x) of inp and writes it transposed.
__global__ void quantize_transposed_kernel(std::uint8_t* out, const bf16* inp, int rows, int cols, const float* scale,
                                           Fp8Format format) {
  __shared__ std::uint8_t tile[kTransposeTile][kTransposeTile + 1];
  const float s = *scale;
  const int c = blockIdx.x * kTransposeTile + threadIdx.x;
  for (int dy = threadIdx.y; dy < kTransposeTile; dy += kTransposeRows) {
    const int r = blockIdx.y * kTransposeTile + dy;
    if (r < rows && c < cols) {
      const float x = __bfloat162float(inp[static_cast<std::size_t>(r) * cols + c]);
      tile[dy][threadIdx.x] = fp8::float_to_fp8(math::mul_rn(x, s), format);
    }
  }
  __syncthreads();
  const int r_out = blockIdx.y * kTransposeTile + threadIdx.x;  // out's column
  for (int dy = threadIdx.y; dy < kTransposeTile; dy += kTransposeRows) {
    const int c_out = blockIdx.x * kTransposeTile + dy;  // out's row
    if (r_out < rows && c_out < cols) out[static_cast<std::size_t>(c_out) * rows + r_out] = tile[threadIdx.x][dy];
  }
}

__global__ void quantize_dequantize_kernel(bf16* out, const bf16* inp, std::size_t n, const float* scale,
                                           Fp8Format format) {
  const float s = *scale;
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = __float2bfloat16_rn(fp8::quantize_dequantize(__bfloat162float(inp[i]), s, format));
  }
}

// --- block scales -------------------------------------------------------------------------------------------------
// A tile: `length` elements at base + i * step, i < length.
struct TileGrid {
  int rows, cols, tile;
  bool along_columns;
  __device__ int tiles_per_line() const { return ((along_columns ? rows : cols) + tile - 1) / tile; }
};

// One warp per tile: its amax, then each element quantized with the tile's scale (Mx: E8M0, else power-of-2 TE).
template <bool Mx>
__global__ void quantize_dequantize_tiles_kernel(bf16* out, const bf16* inp, TileGrid g, std::size_t tiles,
                                                 Fp8Format format) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= tiles) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const int per_line = g.tiles_per_line();
  const auto line = static_cast<int>(t / per_line);
  const int first = static_cast<int>(t % per_line) * g.tile;
  const int extent = g.along_columns ? g.rows : g.cols;
  const int length = min(g.tile, extent - first);
  const std::size_t base = g.along_columns ? static_cast<std::size_t>(first) * g.cols + line
                                           : static_cast<std::size_t>(line) * g.cols + first;
  const std::size_t step = g.along_columns ? static_cast<std::size_t>(g.cols) : 1;
  unsigned local = 0;
  for (int i = lane; i < length; i += 32) local = max(local, magnitude_bits(inp[base + i * step]));
  const float amax = math::float_of(__reduce_max_sync(0xffffffffu, local));
  float scale = 0;
  if constexpr (Mx) {
    scale = fp8::e8m0_to_float(fp8::mx_scale_bits(amax, format));
  } else {
    scale = fp8::scale_from_amax(amax, fp8::fp8_max(format), 1.0f, 0, true);
  }
  for (int i = lane; i < length; i += 32) {
    const float x = __bfloat162float(inp[base + i * step]);
    const float y = Mx ? fp8::mx_quantize_dequantize(x, scale, format) : fp8::quantize_dequantize(x, scale, format);
    out[base + i * step] = __float2bfloat16_rn(y);
  }
}

// Block (256) per `block` x `block` block at (blockIdx.y, blockIdx.x): its amax, then its elements.
__global__ void quantize_dequantize_blocks_kernel(bf16* out, const bf16* inp, int rows, int cols, int block,
                                                  Fp8Format format) {
  __shared__ unsigned warp_max[kWarpsPerBlock];
  const int r0 = blockIdx.y * block, c0 = blockIdx.x * block;
  const int height = min(block, rows - r0), width = min(block, cols - c0);
  const int count = height * width;
  unsigned local = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    local = max(local, magnitude_bits(inp[static_cast<std::size_t>(r0 + i / width) * cols + c0 + i % width]));
  }
  local = __reduce_max_sync(0xffffffffu, local);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = local;
  __syncthreads();
  unsigned amax_bits = 0;
  for (int w = 0; w < kWarpsPerBlock; ++w) amax_bits = max(amax_bits, warp_max[w]);
  const float scale = fp8::scale_from_amax(math::float_of(amax_bits), fp8::fp8_max(format), 1.0f, 0, true);
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const std::size_t at = static_cast<std::size_t>(r0 + i / width) * cols + c0 + i % width;
    out[at] = __float2bfloat16_rn(fp8::quantize_dequantize(__bfloat162float(inp[at]), scale, format));
  }
}

void launch_tiles(bool mx, bf16* out, const bf16* inp, int rows, int cols, int tile, bool along_columns,
                  Fp8Format format, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows >= 0 && cols >= 0 && tile >= 1);
  TWIN_CUDA_REQUIRE(rows == 0 || cols == 0 || (out != nullptr && inp != nullptr));
  if (rows == 0 || cols == 0) return;
  const TileGrid g{rows, cols, tile, along_columns};
  const std::size_t lines = along_columns ? cols : rows;
  const std::size_t tiles = lines * launch::ceil_div(along_columns ? rows : cols, tile);
  const auto blocks = static_cast<unsigned>(launch::ceil_div(tiles, kWarpsPerBlock));
  if (mx) {
    quantize_dequantize_tiles_kernel<true><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(out, inp, g, tiles, format);
  } else {
    quantize_dequantize_tiles_kernel<false><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(out, inp, g, tiles, format);
  }
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void absolute_max(float* amax, const bf16* x, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(amax != nullptr && (n == 0 || x != nullptr));
  if (n == 0) return;
  absolute_max_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(amax, x, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

void fp8_tensor_scale(float* scale, float* scale_inverse, const float* amax, float given_scale, Fp8Format format,
                      cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(scale != nullptr && scale_inverse != nullptr);
  TWIN_CUDA_REQUIRE(amax != nullptr || (given_scale > 0 && fp8::is_finite(given_scale)));
  tensor_scale_kernel<<<1, 1, 0, stream>>>(scale, scale_inverse, amax, given_scale, format);
  TWIN_CUDA_CHECK_LAUNCH();
}

void quantize_fp8(std::uint8_t* out, const bf16* inp, std::size_t n, const float* scale, Fp8Format format,
                  cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(scale != nullptr && (n == 0 || (out != nullptr && inp != nullptr)));
  if (n == 0) return;
  quantize_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n, scale,
                                                                                             format);
  TWIN_CUDA_CHECK_LAUNCH();
}

void quantize_fp8_transposed(std::uint8_t* out, const bf16* inp, int rows, int cols, const float* scale,
                             Fp8Format format, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows >= 0 && cols >= 0 && scale != nullptr);
  TWIN_CUDA_REQUIRE(rows == 0 || cols == 0 || (out != nullptr && inp != nullptr));
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(launch::ceil_div(cols, kTransposeTile)),
                  static_cast<unsigned>(launch::ceil_div(rows, kTransposeTile)));
  TWIN_CUDA_REQUIRE(grid.y <= launch::kMaxGridY);
  quantize_transposed_kernel<<<grid, dim3(kTransposeTile, kTransposeRows), 0, stream>>>(out, inp, rows, cols, scale,
                                                                                        format);
  TWIN_CUDA_CHECK_LAUNCH();
}

void fp8_quantize_dequantize(bf16* out, const bf16* inp, std::size_t n, const float* scale, Fp8Format format,
                             cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(scale != nullptr && (n == 0 || (out != nullptr && inp != nullptr)));
  if (n == 0) return;
  quantize_dequantize_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, inp, n,
                                                                                                        scale, format);
  TWIN_CUDA_CHECK_LAUNCH();
}

void fp8_quantize_dequantize_tiles(bf16* out, const bf16* inp, int rows, int cols, int tile, bool along_columns,
                                   Fp8Format format, cudaStream_t stream) {
  launch_tiles(false, out, inp, rows, cols, tile, along_columns, format, stream);
}

void mxfp8_quantize_dequantize(bf16* out, const bf16* inp, int rows, int cols, bool along_columns, Fp8Format format,
                               cudaStream_t stream) {
  launch_tiles(true, out, inp, rows, cols, fp8::kMxBlock, along_columns, format, stream);
}

void fp8_quantize_dequantize_blocks(bf16* out, const bf16* inp, int rows, int cols, int block, Fp8Format format,
                                    cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows >= 0 && cols >= 0 && block >= 1);
  TWIN_CUDA_REQUIRE(rows == 0 || cols == 0 || (out != nullptr && inp != nullptr));
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(launch::ceil_div(cols, block)),
                  static_cast<unsigned>(launch::ceil_div(rows, block)));
  TWIN_CUDA_REQUIRE(grid.y <= launch::kMaxGridY);
  quantize_dequantize_blocks_kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(out, inp, rows, cols, block, format);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda

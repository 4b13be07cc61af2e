// Internal to kernels/cuda/*.cu (nvcc only): stream-ordered scratch memory and deterministic column sums, the gradient
// of every bias and LayerNorm weight:  out0[c] += sum_r term(r, c).x,  out1[c] += sum_r term(r, c).y.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.hpp"

namespace twin::kernels::cuda::device {

// Scratch memory on `stream` (cudaMallocAsync: the stream's memory pool makes it cheap after the first call), freed
// in stream order when the owner goes out of scope, also when a later check throws.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) TWIN_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
  }
  ~Scratch() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);  // no throw from a destructor; a failure shows up later
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

// Stage 1. Block (kColumnTile, kColumnLanes) owns 32 columns and rows [chunk * kRowsPerChunk, + kRowsPerChunk), chunk =
// blockIdx.y; lane y sums rows y, y + kColumnLanes, ... in order, then lane 0 sums the lanes in order:
//   partial (outputs, chunks, channels)
template <int Outputs, class Term>
__global__ void column_partial_sums_kernel(float* partial, Term term, int rows, int channels) {
  __shared__ float lanes[Outputs][launch::kColumnLanes][launch::kColumnTile + 1];
  const int c = blockIdx.x * launch::kColumnTile + threadIdx.x;
  const int row_begin = blockIdx.y * launch::kRowsPerChunk;
  const int row_end = min(rows, row_begin + launch::kRowsPerChunk);
  float2 sum = make_float2(0.0f, 0.0f);
  if (c < channels) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += launch::kColumnLanes) {
      const float2 t = term(r, c);
      sum.x += t.x;
      if constexpr (Outputs == 2) sum.y += t.y;
    }
  }
  lanes[0][threadIdx.y][threadIdx.x] = sum.x;
  if constexpr (Outputs == 2) lanes[1][threadIdx.y][threadIdx.x] = sum.y;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    const std::size_t chunks = gridDim.y;
    for (int o = 0; o < Outputs; ++o) {
      float total = 0.0f;
      for (int y = 0; y < launch::kColumnLanes; ++y) total += lanes[o][y][threadIdx.x];
      partial[(o * chunks + blockIdx.y) * static_cast<std::size_t>(channels) + c] = total;
    }
  }
}

// Stage 2. out_o[c] += sum over chunks, in order, of partial[o, chunk, c]
template <int Outputs>
__global__ void column_finish_kernel(float* out0, float* out1, const float* partial, int chunks, int channels) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  for (int o = 0; o < Outputs; ++o) {
    const float* p = partial + static_cast<std::size_t>(o) * chunks * channels + c;
    float total = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) total += p[static_cast<std::size_t>(chunk) * channels];
    float* out = o == 0 ? out0 : out1;
    out[c] += total;
  }
}

// out0[c] += sum_r term(r, c).x and, when Outputs == 2, out1[c] += sum_r term(r, c).y, for c < channels.
// Term: a trivially copyable functor with `__device__ float2 operator()(int row, int column) const`.
template <int Outputs, class Term>
void column_sums(float* out0, float* out1, const Term& term, int rows, int channels, cudaStream_t stream) {
  static_assert(Outputs == 1 || Outputs == 2, "one or two sums per column");
  const launch::ColumnSumShape shape = launch::column_sum_shape(rows, channels);
  Scratch partial(shape.partial_floats(Outputs) * sizeof(float), stream);
  column_partial_sums_kernel<Outputs, Term>
      <<<dim3(shape.column_tiles, shape.chunks), dim3(launch::kColumnTile, launch::kColumnLanes), 0, stream>>>(
          partial.as<float>(), term, rows, channels);
  TWIN_CUDA_CHECK_LAUNCH();
  const int threads = 256;
  column_finish_kernel<Outputs><<<static_cast<unsigned>(launch::ceil_div(channels, threads)), threads, 0, stream>>>(
      out0, out1, partial.as<float>(), static_cast<int>(shape.chunks), channels);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda::device

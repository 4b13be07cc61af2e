#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;
using device::from_float;
using device::to_float;

namespace {

// out[i] = a[i] + b[i]
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
}

// y[i] += x[i]
template <class T>
__global__ void accumulate_kernel(T* y, const T* x, std::size_t n) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    y[i] = from_float<T>(to_float(y[i]) + to_float(x[i]));
  }
}

// out[r, c] += bias[c], flat index i = r * channels + c
template <class T>
__global__ void bias_add_kernel(T* out, const T* bias, std::size_t n, int channels) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % channels]));
  }
}

// x[i] *= factor
template <class T>
__global__ void scale_kernel(T* x, std::size_t n, float factor) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    x[i] = from_float<T>(to_float(x[i]) * factor);
  }
}

// x[i] = value
template <class T>
__global__ void fill_kernel(T* x, std::size_t n, float value) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    x[i] = from_float<T>(value);
  }
}

// term of bias_backward's column sums: dout[r, c]
template <class T>
struct BiasGradientTerm {
  const T* dout;
  int channels;
  __device__ float2 operator()(int r, int c) const {
    return make_float2(to_float(dout[static_cast<std::size_t>(r) * channels + c]), 0.0f);
  }
};

// Full reduction, stage 1: partial[block] = sum over this block's grid-stride elements of f(x[i]), in double.
template <bool Square>
__global__ void reduce_partial_kernel(double* partial, const float* x, std::size_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  TWIN_GRID_STRIDE_LOOP(i, n) {
    const double value = x[i];
    s += Square ? value * value : value;
  }
  s = device::block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Stage 2, one block: *result = sum of the partials (strided per thread, then the block's fixed tree)
__global__ void reduce_finish_kernel(double* result, const double* partial, int blocks) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = device::block_sum(s, shared);
  if (threadIdx.x == 0) *result = s;
}

template <class T>
void launch_residual(T* out, const T* a, const T* b, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && a != nullptr && b != nullptr));
  if (n == 0) return;
  residual_forward_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, a, b, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_accumulate(T* y, const T* x, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (y != nullptr && x != nullptr));
  if (n == 0) return;
  accumulate_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(y, x, n);
  TWIN_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_bias_add(T* out, const T* bias, int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && bias != nullptr);
  const std::size_t n = static_cast<std::size_t>(rows) * channels;
  bias_add_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(out, bias, n, channels);
  TWIN_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_bias_backward(float* dbias, const T* dout, int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(dbias != nullptr && dout != nullptr);
  device::column_sums<1>(dbias, nullptr, BiasGradientTerm<T>{dout, channels}, rows, channels, stream);
}

template <class T>
void launch_scale(T* x, std::size_t n, float factor, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || x != nullptr);
  if (n == 0) return;
  scale_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(x, n, factor);
  TWIN_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_copy(T* out, const T* inp, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (out != nullptr && inp != nullptr));
  TWIN_CUDA_REQUIRE(n == 0 || out + n <= inp || inp + n <= out);
  if (n == 0) return;
  TWIN_CUDA_CHECK(cudaMemcpyAsync(out, inp, n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
}

template <class T>
void launch_fill(T* x, std::size_t n, float value, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || x != nullptr);
  if (n == 0) return;
  fill_kernel<T><<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(x, n, value);
  TWIN_CUDA_CHECK_LAUNCH();
}

template <bool Square>
void launch_reduce(double* result, const float* x, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(result != nullptr);
  TWIN_CUDA_REQUIRE(n == 0 || x != nullptr);
  if (n == 0) {
    TWIN_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));  // all-zero bits are +0.0
    return;
  }
  const unsigned blocks = launch::reduce_blocks(n);
  device::Scratch partial(blocks * sizeof(double), stream);
  reduce_partial_kernel<Square><<<blocks, launch::kReduceThreads, 0, stream>>>(partial.as<double>(), x, n);
  TWIN_CUDA_CHECK_LAUNCH();
  reduce_finish_kernel<<<1, launch::kReduceThreads, 0, stream>>>(result, partial.as<double>(),
                                                                 static_cast<int>(blocks));
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream) {
  launch_residual(out, a, b, n, stream);
}
void residual_forward(float* out, const float* a, const float* b, std::size_t n, cudaStream_t stream) {
  launch_residual(out, a, b, n, stream);
}

void accumulate(bf16* y, const bf16* x, std::size_t n, cudaStream_t stream) {
  launch_accumulate(y, x, n, stream);
}
void accumulate(float* y, const float* x, std::size_t n, cudaStream_t stream) {
  launch_accumulate(y, x, n, stream);
}

void bias_add(bf16* out, const bf16* bias, int rows, int channels, cudaStream_t stream) {
  launch_bias_add(out, bias, rows, channels, stream);
}
void bias_add(float* out, const float* bias, int rows, int channels, cudaStream_t stream) {
  launch_bias_add(out, bias, rows, channels, stream);
}

void bias_backward(float* dbias, const bf16* dout, int rows, int channels, cudaStream_t stream) {
  launch_bias_backward(dbias, dout, rows, channels, stream);
}
void bias_backward(float* dbias, const float* dout, int rows, int channels, cudaStream_t stream) {
  launch_bias_backward(dbias, dout, rows, channels, stream);
}

void scale(float* x, std::size_t n, float factor, cudaStream_t stream) {
  launch_scale(x, n, factor, stream);
}
void scale(bf16* x, std::size_t n, float factor, cudaStream_t stream) {
  launch_scale(x, n, factor, stream);
}

void copy(float* out, const float* inp, std::size_t n, cudaStream_t stream) {
  launch_copy(out, inp, n, stream);
}
void copy(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream) {
  launch_copy(out, inp, n, stream);
}

void fill(float* x, std::size_t n, float value, cudaStream_t stream) {
  launch_fill(x, n, value, stream);
}
void fill(bf16* x, std::size_t n, float value, cudaStream_t stream) {
  launch_fill(x, n, value, stream);
}

void squared_norm(double* result, const float* x, std::size_t n, cudaStream_t stream) {
  launch_reduce<true>(result, x, n, stream);
}
void sum(double* result, const float* x, std::size_t n, cudaStream_t stream) {
  launch_reduce<false>(result, x, n, stream);
}

}  // namespace twin::kernels::cuda

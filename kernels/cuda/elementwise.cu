#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;
using device::from_float;
using device::to_float;

namespace {

// the element-wise operations, in fp32 (device::map_kernel applies them 16 bytes at a time)
struct Add {
  __device__ float operator()(std::size_t, float a, float b) const { return a + b; }
};
struct Scale {
  float factor;
  __device__ float operator()(std::size_t, float x, float) const { return x * factor; }
};
struct Value {
  float value;
  __device__ float operator()(std::size_t, float, float) const { return value; }
};
template <class T>
struct AddBias {  // out[r, c] += bias[c], flat index i = r * channels + c
  const T* bias;
  int channels;
  __device__ float operator()(std::size_t i, float x, float) const { return x + to_float(bias[i % channels]); }
};

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
  device::launch_map<2>(out, a, b, n, Add{}, stream);
}

template <class T>
void launch_accumulate(T* y, const T* x, std::size_t n, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (y != nullptr && x != nullptr));
  device::launch_map<2>(y, static_cast<const T*>(y), x, n, Add{}, stream);
}

template <class T>
void launch_bias_add(T* out, const T* bias, int rows, int channels, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && channels > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && bias != nullptr);
  const std::size_t n = static_cast<std::size_t>(rows) * channels;
  device::launch_map<1>(out, static_cast<const T*>(out), static_cast<const T*>(nullptr), n, AddBias<T>{bias, channels},
                        stream);
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
  device::launch_map<1>(x, static_cast<const T*>(x), static_cast<const T*>(nullptr), n, Scale{factor}, stream);
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
  device::launch_map<0>(x, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), n, Value{value}, stream);
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

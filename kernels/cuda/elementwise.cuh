// Element-wise helpers on the device, twins of kernels/cpu/elementwise.hpp: the residual stream, the row-parallel
// bias, gradient buffers and the global gradient norm. Activations are bf16 (fp32 overloads serve the fp32 buffers:
// parameter gradients, master weights); arithmetic is fp32, each bf16 result rounded once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace twin::kernels::cuda {

// out (n) = a (n) + b (n)             the residual connection; out may alias a or b
void residual_forward(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, std::size_t n,
                      cudaStream_t stream);
void residual_forward(float* out, const float* a, const float* b, std::size_t n, cudaStream_t stream);

// y (n) += x (n)                      a branch's gradient into the stream, a micro-batch's gradients, a reduction step
void accumulate(__nv_bfloat16* y, const __nv_bfloat16* x, std::size_t n, cudaStream_t stream);
void accumulate(float* y, const float* x, std::size_t n, cudaStream_t stream);

// out (rows, channels) += bias (channels) broadcast over rows (the row-parallel bias, after the TP all-reduce)
void bias_add(__nv_bfloat16* out, const __nv_bfloat16* bias, int rows, int channels, cudaStream_t stream);
void bias_add(float* out, const float* bias, int rows, int channels, cudaStream_t stream);

// dbias (channels) += sum over rows of dout (rows, channels). ACCUMULATES, fp32, deterministic (fixed chunked order).
void bias_backward(float* dbias, const __nv_bfloat16* dout, int rows, int channels, cudaStream_t stream);
void bias_backward(float* dbias, const float* dout, int rows, int channels, cudaStream_t stream);

// x (n) *= factor                     e.g. averaging gradients after a DP all-reduce sum
void scale(float* x, std::size_t n, float factor, cudaStream_t stream);
void scale(__nv_bfloat16* x, std::size_t n, float factor, cudaStream_t stream);

// out (n) = inp (n)                   device to device; out must not overlap inp
void copy(float* out, const float* inp, std::size_t n, cudaStream_t stream);
void copy(__nv_bfloat16* out, const __nv_bfloat16* inp, std::size_t n, cudaStream_t stream);

// x (n) = value                       e.g. zeroing gradients before the first micro-batch
void fill(float* x, std::size_t n, float value, cudaStream_t stream);
void fill(__nv_bfloat16* x, std::size_t n, float value, cudaStream_t stream);

// *result (one double in device memory) = sum_i x[i]^2, in double, deterministic (the order depends on n alone).
// The CPU twin returns the value; here it stays on the device until the caller copies it (no synchronization).
void squared_norm(double* result, const float* x, std::size_t n, cudaStream_t stream);

// *result (one double in device memory) = sum_i x[i], in double, deterministic (e.g. the sum of a micro-batch's losses)
void sum(double* result, const float* x, std::size_t n, cudaStream_t stream);

}  // namespace twin::kernels::cuda

// Element-wise helpers of the residual stream, the row-parallel bias, gradient buffers and the global gradient norm.
#pragma once

#include <cstddef>

namespace twin::kernels::cpu {

// out (n) = a (n) + b (n)      the residual connection; out may alias a or b
void residual_forward(float* out, const float* a, const float* b, std::size_t n);

// y (n) += x (n)               e.g. a residual branch's gradient into the stream, or a micro-batch's gradients
void accumulate(float* y, const float* x, std::size_t n);

// out (rows, channels) += bias (channels) broadcast over rows. The bias of a row-parallel linear, added once after the
// TP all-reduce (matmul_forward ran with bias = nullptr).
void bias_add(float* out, const float* bias, int rows, int channels);

// dbias (channels) += sum over rows of dout (rows, channels), rows in order. ACCUMULATES.
void bias_backward(float* dbias, const float* dout, int rows, int channels);

// x (n) *= factor              e.g. averaging gradients after a DP all-reduce sum
void scale(float* x, std::size_t n, float factor);

// out (n) = inp (n)            out must not overlap inp
void copy(float* out, const float* inp, std::size_t n);

// x (n) = value                e.g. zeroing gradients before the first micro-batch
void fill(float* x, std::size_t n, float value);

// sum_i x[i]^2 in double, in a fixed order (8 interleaved partial sums): deterministic. The global gradient norm is the
// sqrt of the sum over tensors (and over ranks, after an all-reduce of the per-rank sums).
double squared_norm(const float* x, std::size_t n);

}  // namespace twin::kernels::cpu

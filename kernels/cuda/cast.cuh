// fp32 <-> bf16 conversions on the device, twins of kernels/cpu/cast.hpp: round to nearest, ties to even
// (cvt.rn.bf16.f32, the same bits as cpu::float_to_bf16 for every non-NaN input; a NaN stays a NaN), and exact
// widening.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace twin::kernels::cuda {

// out (n) bf16 <- inp (n) fp32, rounded to nearest even
void cast_float_to_bf16(__nv_bfloat16* out, const float* inp, std::size_t n, cudaStream_t stream);

// out (n) fp32 <- inp (n) bf16, exact
void cast_bf16_to_float(float* out, const __nv_bfloat16* inp, std::size_t n, cudaStream_t stream);

// out (n) = fp32(bf16(inp (n))); out may alias inp
void round_to_bf16(float* out, const float* inp, std::size_t n, cudaStream_t stream);

}  // namespace twin::kernels::cuda

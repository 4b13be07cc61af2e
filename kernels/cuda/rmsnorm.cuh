// RMSNorm over the last dimension on the device, twin of kernels/cpu/rmsnorm.hpp, eps = 1e-5: LayerNorm without the
// mean subtraction and without the bias:
//   out = inp * rstd * weight,   rstd = 1 / sqrt(mean(inp^2) + eps)   per row
// bf16 activations and weights, fp32 statistics and weight gradients, fp32 arithmetic. One warp per row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

inline constexpr float kRmsNormEps = 1e-5f;

// out (rows, channels), rstd (rows) <- inp (rows, channels), weight (channels)
// Overwrites out and rstd (save rstd for the backward). out must not alias inp.
void rmsnorm_forward(__nv_bfloat16* out, float* rstd, const __nv_bfloat16* inp, const __nv_bfloat16* weight, int rows,
                     int channels, cudaStream_t stream);

// Backward of rmsnorm_forward, given dout (rows, channels) and the saved rstd (rows), with norm = inp * rstd:
//   dinp    (rows, channels) += rstd * (dout * weight - norm * mean(dout * weight * norm))   ACCUMULATED (the residual
//                                     stream's gradient), bf16
//   dweight (channels)       += sum over rows of dout * norm                                 ACCUMULATED, fp32,
//                                                                                            deterministic
// dinp must not alias dout or inp.
void rmsnorm_backward(__nv_bfloat16* dinp, float* dweight, const __nv_bfloat16* dout, const __nv_bfloat16* inp,
                      const __nv_bfloat16* weight, const float* rstd, int rows, int channels, cudaStream_t stream);

}  // namespace twin::kernels::cuda

// LayerNorm over the last dimension on the device, twin of kernels/cpu/layernorm.hpp, eps = 1e-5:
//   out = (inp - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps),   var biased (divides by channels)
// bf16 activations and weights, fp32 statistics and weight gradients, fp32 arithmetic. One warp per row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

inline constexpr float kLayerNormEps = 1e-5f;

// out (rows, channels), mean (rows), rstd (rows) <- inp (rows, channels), weight (channels), bias (channels)
// Overwrites out, mean and rstd (save mean and rstd for the backward). out must not alias inp.
void layernorm_forward(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* inp,
                       const __nv_bfloat16* weight, const __nv_bfloat16* bias, int rows, int channels,
                       cudaStream_t stream);

// Fused residual + LayerNorm (llm.c's fused_residual_forward), the pattern at every block boundary:
//   residual (rows, channels) = a + b (rounded to bf16),  then layernorm_forward(out, mean, rstd, residual, ...)
// One pass over a and b instead of a residual kernel then a LayerNorm kernel. residual may alias a or b; out must not
// alias residual, a or b.
void residual_layernorm_forward(__nv_bfloat16* residual, __nv_bfloat16* out, float* mean, float* rstd,
                                const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* weight,
                                const __nv_bfloat16* bias, int rows, int channels, cudaStream_t stream);

// Backward of layernorm_forward, given dout (rows, channels) and the saved mean, rstd (rows):
//   dinp    (rows, channels) += ...                        ACCUMULATED (the residual stream's gradient), bf16
//   dweight (channels)       += sum over rows of dout * norm   ACCUMULATED, fp32, deterministic
//   dbias   (channels)       += sum over rows of dout          ACCUMULATED, fp32, deterministic
// dinp must not alias dout or inp.
void layernorm_backward(__nv_bfloat16* dinp, float* dweight, float* dbias, const __nv_bfloat16* dout,
                        const __nv_bfloat16* inp, const __nv_bfloat16* weight, const float* mean, const float* rstd,
                        int rows, int channels, cudaStream_t stream);

}  // namespace twin::kernels::cuda

// RMSNorm over the last dimension (Zhang & Sennrich 2019, arXiv:1910.07467; Llama; Megatron-Core's
// --normalization RMSNorm), eps = 1e-5: LayerNorm without the mean subtraction and without the bias:
//   out = inp * rstd * weight,   rstd = 1 / sqrt(mean(inp^2) + eps)   per row
#pragma once

namespace twin::kernels::cpu {

inline constexpr float kRmsNormEps = 1e-5f;

// out (rows, channels), rstd (rows) <- inp (rows, channels), weight (channels)
// Overwrites out and rstd; the backward needs rstd (save it). out must not alias inp.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int rows, int channels);

// Backward of rmsnorm_forward, given dout (rows, channels) and the saved rstd (rows), with norm = inp * rstd:
//   dinp    (rows, channels) += rstd * (dout * weight - norm * mean(dout * weight * norm))   ACCUMULATED: the RMSNorm
//                                     input is the residual stream, as layernorm_backward's
//   dweight (channels)       += sum over rows of dout * norm                                 ACCUMULATED
// dinp must not alias dout or inp.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int rows, int channels);

}  // namespace twin::kernels::cpu

// LayerNorm over the last dimension (GPT-2: before attention, before the MLP, and once at the end), eps = 1e-5:
//   out = (inp - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps),   var biased (divides by channels)
#pragma once

namespace twin::kernels::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

// out (rows, channels), mean (rows), rstd (rows) <- inp (rows, channels), weight (channels), bias (channels)
// Overwrites out, mean and rstd; the backward needs mean and rstd (save them). out must not alias inp.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int rows, int channels);

// Backward of layernorm_forward, given dout (rows, channels) and the saved mean, rstd (rows):
//   dinp    (rows, channels) += ...   ACCUMULATED: the LayerNorm input is the residual stream, whose gradient
//                                     already holds the residual path's dout (llm.c's convention)
//   dweight (channels)       += sum over rows of dout * norm        ACCUMULATED
//   dbias   (channels)       += sum over rows of dout               ACCUMULATED
// dinp must not alias dout or inp.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int rows, int channels);

}  // namespace twin::kernels::cpu

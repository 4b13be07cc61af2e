// GELU, tanh approximation (GPT-2's "gelu_new"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#pragma once

#include <cstddef>

namespace twin::kernels::cpu {

// out (n) = gelu(inp (n)). Overwrites out; out may alias inp (but the backward needs inp: keep it when training).
void gelu_forward(float* out, const float* inp, std::size_t n);

// dinp (n) = gelu'(inp (n)) * dout (n). OVERWRITES dinp (the MLP's hidden activation has one consumer); dinp may
// alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);

}  // namespace twin::kernels::cpu

// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202; Llama; Megatron-Core's --swiglu): the
// MLP's first GEMM writes 2*width columns per row, [gate (width) | up (width)] (Megatron-Core: torch.chunk(x, 2, -1),
// silu(x[0]) * x[1]), and the activation gates one half by the other:
//   out = silu(gate) * up,   silu(g) = g * sigmoid(g),   sigmoid(g) = 1 / (1 + exp(-g))
#pragma once

namespace twin::kernels::cpu {

// out (rows, width) <- inp (rows, 2*width), each row [gate | up]. Overwrites out; out must not alias inp (the
// backward needs inp whole). No inf or NaN from the sigmoid at any finite gate.
void swiglu_forward(float* out, const float* inp, int rows, int width);

// dinp (rows, 2*width) <- inp (rows, 2*width), dout (rows, width):
//   d gate = dout * up * silu'(gate),   silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g)))
//   d up   = dout * silu(gate)
// OVERWRITES dinp (the first GEMM's output has one consumer). dinp must not alias inp or dout.
void swiglu_backward(float* dinp, const float* inp, const float* dout, int rows, int width);

}  // namespace twin::kernels::cpu

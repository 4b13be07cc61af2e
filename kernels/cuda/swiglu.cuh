// SwiGLU (Shazeer 2020, arXiv:2002.05202; Llama) on the device, twin of kernels/cpu/swiglu.hpp: the MLP's first GEMM
// writes 2*width columns per row, [gate (width) | up (width)], and the activation gates one half by the other:
//   out = silu(gate) * up,   silu(g) = g * sigmoid(g),   sigmoid(g) = 1 / (1 + exp(-g))   (formulas shared with the
//   host: math.hpp)
// bf16 in and out, fp32 arithmetic. One thread per output element (grid-stride loop).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace twin::kernels::cuda {

// out (rows, width) <- inp (rows, 2*width), each row [gate | up]. Overwrites out; out must not alias inp (the
// backward needs inp whole).
void swiglu_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, int rows, int width, cudaStream_t stream);

// dinp (rows, 2*width) <- inp (rows, 2*width), dout (rows, width):
//   d gate = dout * up * silu'(gate),   silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g)))
//   d up   = dout * silu(gate)
// OVERWRITES dinp. dinp must not alias inp or dout.
void swiglu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout, int rows, int width,
                     cudaStream_t stream);

}  // namespace twin::kernels::cuda

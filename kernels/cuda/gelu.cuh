// GELU, tanh approximation (GPT-2's "gelu_new"), on the device, twin of kernels/cpu/gelu.hpp:
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))      (formulas shared with the host: math.hpp)
// bf16 in and out, fp32 arithmetic. matmul_forward_gelu (matmul.cuh) fuses the forward into the fc GEMM instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace twin::kernels::cuda {

// out (n) = gelu(inp (n)). Overwrites out; out may alias inp (the backward needs inp: keep it when training).
void gelu_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, std::size_t n, cudaStream_t stream);

// dinp (n) = gelu'(inp (n)) * dout (n). OVERWRITES dinp; dinp may alias dout.
void gelu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout, std::size_t n,
                   cudaStream_t stream);

}  // namespace twin::kernels::cuda

// A linear layer's GEMMs with FP8 operands, emulated in fp32: each operand is quantized as Transformer Engine
// quantizes it for that GEMM and read back, then the fp32 GEMM of matmul.hpp runs on the values an FP8 tensor core
// would multiply (its products are exact in fp32 and it accumulates in fp32, as cuBLASLt's FP8 GEMMs do).
//
// Block scales run along a GEMM's reduction dimension K, so an operand used by two GEMMs with different K is
// quantized twice from its high-precision values, once per direction (TE: "rowwise" and "columnwise" copies; never
// the transpose of an FP8 tensor, which would quantize twice):
//   fprop  out = inp @ weight^T          K = in_features:  inp and weight along their rows
//   dgrad  dinp = dout @ weight          K = out_features: dout along its rows, weight along its columns
//   wgrad  dweight = dout^T @ inp        K = rows:         dout and inp along their columns
// Per-tensor scales (delayed, tensorwise) have no direction: both copies are the same.
#pragma once

#include "kernels/cpu/fp8.hpp"

namespace twin::kernels::cpu {

// How one operand of an FP8 GEMM is quantized.
enum class Fp8Scaling : unsigned char {
  PerTensor,  // one scale, `scale` (delayed scaling: from earlier steps' amaxes)
  Current,    // one scale from the tensor's own amax (tensorwise: Float8CurrentScaling)
  Tiles,      // a power-of-2 scale per 1 x 128 tile along K (blockwise: activations and gradients)
  Blocks,     // a power-of-2 scale per 128 x 128 block (blockwise: weights)
  Mx,         // an E8M0 scale per 32 elements along K (mxfp8)
};

struct Fp8Operand {
  Fp8Format format = Fp8Format::E4M3;
  Fp8Scaling scaling = Fp8Scaling::Current;
  float scale = 1.0f;  // PerTensor only
};

// out (rows, cols) <- inp (rows, cols) quantized as `operand` says and read back; blocks run along each row
// (along_columns false) or down each column (true). out may not alias inp.
void fp8_quantize_operand(float* out, const float* inp, int rows, int cols, const Fp8Operand& operand,
                          bool along_columns);

// matmul_forward with FP8 operands: out (rows, out_features) = q(inp) @ q(weight)^T + bias (bias in fp32, as TE adds
// it in the GEMM's epilogue).
void fp8_matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int rows, int in_features,
                        int out_features, const Fp8Operand& input, const Fp8Operand& weights);

// matmul_backward with FP8 operands (the output's gradient quantized as `gradient`, E5M2 under the hybrid format):
// dinp OVERWRITTEN (nullptr: not computed), dweight ACCUMULATED, dbias ACCUMULATED from the unquantized dout (TE fuses
// the bias gradient into the cast, before it quantizes).
void fp8_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, int rows, int in_features, int out_features, const Fp8Operand& input,
                         const Fp8Operand& weights, const Fp8Operand& gradient);

}  // namespace twin::kernels::cpu

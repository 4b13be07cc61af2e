// A linear layer's GEMMs with FP8 operands on the device, twins of kernels/cpu/fp8_matmul.hpp (same operands, same
// quantization along each GEMM's K; bf16 activations, fp32 weight and bias gradients as matmul.cuh).
//
// How each recipe runs:
//   PerTensor (delayed), Current (tensorwise)  cuBLASLt's FP8 GEMM (fp8.cuh): operands quantized to E4M3 / E5M2
//        bytes, the backward's columnwise copies transposed as they are quantized, scale inverses by device pointer;
//        fp32 accumulation, bf16 output with the bias in the epilogue. Where cuBLASLt has no FP8 algorithm (below
//        sm_89, a K or out_features not a multiple of 16), the same quantized values dequantized to bf16 and the bf16
//        GEMM (each value then also rounded to bf16: within bf16 of the FP8 GEMM's).
//   Tiles, Blocks (blockwise), Mx (mxfp8)       quantize then dequantize to bf16 with the recipe's scales, then the
//        bf16 GEMM: FP8 numerics at the bf16 rate. The dequantized values are exact in bf16 (an FP8 value times a
//        power of two), so the product is the one an FP8 block-scaled GEMM computes up to the order of the sums.
//        cuBLASLt 13 has the block scale modes (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F on sm_90,
//        VEC32_UE8M0 on sm_100) but they are not wired up here yet.
// Amaxes (what delayed scaling records) are the whole tensors' largest magnitudes, written to device memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda/fp8.cuh"

namespace twin::kernels::cuda {

// How one operand of an FP8 GEMM is quantized (kernels/cpu/fp8_matmul.hpp's Fp8Scaling).
enum class Fp8Scaling : unsigned char { PerTensor, Current, Tiles, Blocks, Mx };

struct Fp8Operand {
  Fp8Format format = Fp8Format::E4M3;
  Fp8Scaling scaling = Fp8Scaling::Current;
  float scale = 1.0f;  // PerTensor only
};

// true when the operand has one scale for the whole tensor (delayed or tensorwise scaling)
inline bool per_tensor(const Fp8Operand& x) {
  return x.scaling == Fp8Scaling::PerTensor || x.scaling == Fp8Scaling::Current;
}

// true when the recipe's two operands run on cuBLASLt's FP8 GEMM (per-tensor scales), false: quantize-dequantize
inline bool runs_fp8_gemm(const Fp8Operand& a, const Fp8Operand& b) {
  return per_tensor(a) && per_tensor(b) && !(a.format == Fp8Format::E5M2 && b.format == Fp8Format::E5M2);
}

// out (rows, out_features) = q(inp (rows, in_features)) @ q(weight (out_features, in_features))^T + bias (or nullptr)
// amaxes (2, device fp32) OVERWRITTEN: max |inp|, max |weight|
void fp8_matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                        const __nv_bfloat16* bias, int rows, int in_features, int out_features, const Fp8Operand& input,
                        const Fp8Operand& weights, float* amaxes, Cublas& blas, Fp8GemmPlans& plans,
                        cudaStream_t stream);

// dinp (rows, in_features) OVERWRITTEN (nullptr: not computed), dweight (out_features, in_features) ACCUMULATED fp32,
// dbias (out_features) ACCUMULATED fp32 from the unquantized dout (nullptr: none), dout quantized as `gradient`.
// amax (1, device fp32) OVERWRITTEN: max |dout|
void fp8_matmul_backward(__nv_bfloat16* dinp, float* dweight, float* dbias, const __nv_bfloat16* dout,
                         const __nv_bfloat16* inp, const __nv_bfloat16* weight, int rows, int in_features,
                         int out_features, const Fp8Operand& input, const Fp8Operand& weights,
                         const Fp8Operand& gradient, float* amax, Cublas& blas, Fp8GemmPlans& plans,
                         cudaStream_t stream);

}  // namespace twin::kernels::cuda

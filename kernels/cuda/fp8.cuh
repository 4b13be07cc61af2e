// FP8 on the device, the pieces of an FP8 GEMM (kernels/cuda/fp8_matmul.cuh puts them together): amax reductions, the
// scales that follow from them, quantization of bf16 tensors to E4M3 / E5M2 bytes (plain and transposed), the
// quantize-then-dequantize of the block-scaled recipes, and cuBLASLt's FP8 GEMM with per-tensor scales. Every value
// is fp8_math.hpp's formula, the twin of kernels/cpu/fp8.hpp (E4M3 / E5M2 bytes hold the bits of cuda_fp8.h's
// __nv_fp8_e4m3 / __nv_fp8_e5m2, which cuBLASLt reads as CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2).
//
// Hopper's FP8 GEMMs take only the "TN" layout (A transposed, B not: K contiguous in both operands). Transformer Engine
// gets there by keeping a "columnwise" copy of an FP8 tensor, the transpose of its data quantized with the same scale
// (transformer_engine/common/gemm/cublaslt_gemm.cu, CanonicalizeGemmInput: "Hopper only supports TN GEMMs for FP8";
// nvte_is_non_tn_fp8_gemm_supported() is true from compute capability 10.0): quantize_fp8_transposed writes it.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "kernels/cuda/fp8_math.hpp"

namespace twin::kernels::cuda {

class Cublas;
using fp8::Fp8Format;

// amax (1, fp32) = max(amax, max |x|) over x (n): fill amax with 0 first (cudaMemsetAsync). NaN when an element is
// NaN. (An atomic max of the magnitudes' bits: a maximum does not depend on the order, so the result is deterministic.)
void absolute_max(float* amax, const __nv_bfloat16* x, std::size_t n, cudaStream_t stream);

// The per-tensor scale of an operand and its inverse (1 fp32 each, device): from *amax when amax != nullptr
// (tensorwise: fp8::scale_from_amax with a previous scale of 1), else `given_scale` (delayed scaling's scale).
void fp8_tensor_scale(float* scale, float* scale_inverse, const float* amax, float given_scale, Fp8Format format,
                      cudaStream_t stream);

// out (n) FP8 bytes = fp8(inp (n) * *scale), saturated
void quantize_fp8(std::uint8_t* out, const __nv_bfloat16* inp, std::size_t n, const float* scale, Fp8Format format,
                  cudaStream_t stream);
// out (cols, rows) FP8 bytes = fp8(inp (rows, cols) * *scale) transposed: the columnwise copy
void quantize_fp8_transposed(std::uint8_t* out, const __nv_bfloat16* inp, int rows, int cols, const float* scale,
                             Fp8Format format, cudaStream_t stream);

// --- quantize then dequantize, bf16 -> bf16 (the dequantized values: exact in bf16 for power-of-2 scales) -----------
// out (n) = fp8(inp * *scale) / *scale: one scale for the tensor
void fp8_quantize_dequantize(__nv_bfloat16* out, const __nv_bfloat16* inp, std::size_t n, const float* scale,
                             Fp8Format format, cudaStream_t stream);
// out (rows, cols) <- inp (rows, cols) in 1 x `tile` tiles of each row (along_columns: `tile` x 1 tiles of each
// column), a power-of-2 scale per tile from its amax; the last tile of a row (column) may be shorter
void fp8_quantize_dequantize_tiles(__nv_bfloat16* out, const __nv_bfloat16* inp, int rows, int cols, int tile,
                                   bool along_columns, Fp8Format format, cudaStream_t stream);
// the same in `block` x `block` blocks
void fp8_quantize_dequantize_blocks(__nv_bfloat16* out, const __nv_bfloat16* inp, int rows, int cols, int block,
                                    Fp8Format format, cudaStream_t stream);
// MXFP8: 32 consecutive elements of a row (along_columns: of a column) share an E8M0 scale (Transformer Engine's rule)
void mxfp8_quantize_dequantize(__nv_bfloat16* out, const __nv_bfloat16* inp, int rows, int cols, bool along_columns,
                               Fp8Format format, cudaStream_t stream);

// --- cuBLASLt's FP8 GEMM ------------------------------------------------------------------------------------------
// An FP8 operand: bytes, format, and the device fp32 its products are multiplied by (the inverse of its scale).
struct Fp8Matrix {
  const std::uint8_t* data = nullptr;
  Fp8Format format = Fp8Format::E4M3;
  const float* scale_inverse = nullptr;
};

// Descriptors and algorithm of each FP8 GEMM problem met so far (fp8.cu), built once per problem like Cublas's plans;
// use with one Cublas (its handle and workspace); not thread-safe.
class Fp8GemmPlans {
 public:
  Fp8GemmPlans();
  ~Fp8GemmPlans();
  Fp8GemmPlans(const Fp8GemmPlans&) = delete;
  Fp8GemmPlans& operator=(const Fp8GemmPlans&) = delete;
  struct Plan;
  struct Key {
    int m = 0, n = 0, k = 0, a_format = 0, b_format = 0, d_type = 0;
    bool accumulate = false, bias = false;
    std::uint32_t align_a = 0, align_b = 0, align_d = 0;  // bytes (a power of two, at most 256)
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && a_format == o.a_format && b_format == o.b_format &&
             d_type == o.d_type && accumulate == o.accumulate && bias == o.bias && align_a == o.align_a &&
             align_b == o.align_b && align_d == o.align_d;
    }
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };
  Plan& plan_for(Cublas& blas, const Key& key);
  std::size_t problems() const { return plans_.size(); }

 private:
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

// The TN GEMM in column-major terms: D (m, n) = a_inv b_inv A^T B (+ D when accumulate) (+ bias (m) per row of D)
//   A: data (k, m) column-major (ld k), i.e. row-major (m, k);  B: data (k, n) column-major (ld k), row-major (n, k)
// D bf16 or fp32 (d_type CUDA_R_16BF / CUDA_R_32F, ld m); bias bf16 (D bf16 only; nullptr: none); fp32 accumulation.
// A and B may not both be E5M2. Returns false (nothing run) when cuBLASLt has no algorithm for the problem (below
// sm_89, or shapes whose K or leading dimensions are not multiples of 16): the caller takes another path.
bool try_fp8_gemm(Cublas& blas, Fp8GemmPlans& plans, int m, int n, int k, const Fp8Matrix& a, const Fp8Matrix& b,
                  void* d, cudaDataType_t d_type, bool accumulate, const __nv_bfloat16* bias, cudaStream_t stream);

}  // namespace twin::kernels::cuda

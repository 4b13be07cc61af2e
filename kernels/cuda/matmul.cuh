// Linear layers on the device through cuBLASLt, twins of kernels/cpu/matmul.hpp. Weight (out_features, in_features)
// row-major as nn.Linear:  out = inp @ weight^T + bias. Activations and weights bf16, fp32 accumulation (tensor
// cores), weight and bias gradients fp32 (accumulated by the GEMM itself: beta = 1). gemm_plan.hpp says how each
// row-major product maps onto cuBLASLt's column-major GEMM; the tests run those plans on the CPU.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "kernels/cuda/gemm_plan.hpp"

namespace twin::kernels::cuda {

// One cuBLASLt handle with its workspace and the algorithms chosen so far. A GEMM uses the workspace while it runs:
// give every stream that runs GEMMs concurrently its own Cublas (a rank with one compute stream needs one); not
// thread-safe.
class Cublas {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;  // 32 MiB: what Hopper kernels ask for
  explicit Cublas(std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // The algorithm cuBLASLt's heuristic chose for a problem (shapes, types, epilogue, alignments, spelled as `key`):
  // asked once per problem, then reused (a model runs the same few dozen GEMMs every step).
  const cublasLtMatmulAlgo_t* find_algorithm(const std::string& key) const {
    const auto it = algorithms_.find(key);
    return it == algorithms_.end() ? nullptr : &it->second;
  }
  void remember_algorithm(const std::string& key, const cublasLtMatmulAlgo_t& algorithm) {
    algorithms_[key] = algorithm;
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::unordered_map<std::string, cublasLtMatmulAlgo_t> algorithms_;
};

// What cuBLASLt applies to D after the product (per row of the column-major D, i.e. per output feature).
enum class GemmEpilogue {
  None,
  Bias,         // D += bias (m), bias of D's type
  GeluAuxBias,  // aux = D + bias (the pre-activation, D's type and layout, ld aux_ld), D = gelu(aux)
};

// The generic batched GEMM every kernel of this folder uses: D = alpha op(A) op(B) + beta D as `plan` says
// (column-major, offsets and strides in elements). Types: A and B bf16; D bf16 or fp32; fp32 accumulation and scaling.
// bias and aux only with the epilogues that use them. Throws std::runtime_error naming the plan when cuBLASLt has no
// algorithm.
void gemm(Cublas& blas, const GemmPlan& plan, const __nv_bfloat16* a, const __nv_bfloat16* b, void* d,
          cudaDataType_t d_type, cudaStream_t stream, GemmEpilogue epilogue = GemmEpilogue::None,
          const __nv_bfloat16* bias = nullptr, __nv_bfloat16* aux = nullptr, std::int64_t aux_ld = 0);

// out (rows, out_features) = inp (rows, in_features) @ weight^T (in_features, out_features) + bias (out_features)
// Overwrites out. bias may be nullptr (no bias; with one, cuBLASLt's bias epilogue adds it). out must not alias inp or
// weight.
void matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
                    const __nv_bfloat16* bias, int rows, int in_features, int out_features, Cublas& blas,
                    cudaStream_t stream);

// The MLP's first layer with GELU fused into the GEMM's epilogue:
//   pre_gelu (rows, out_features) = inp @ weight^T + bias,   out (rows, out_features) = gelu(pre_gelu)
// (cuBLASLt's GELU is the tanh approximation of gelu.cuh). Keep pre_gelu for gelu_backward. bias is required,
// out_features a multiple of 8 (cuBLASLt's rule for the auxiliary output).
void matmul_forward_gelu(__nv_bfloat16* out, __nv_bfloat16* pre_gelu, const __nv_bfloat16* inp,
                         const __nv_bfloat16* weight, const __nv_bfloat16* bias, int rows, int in_features,
                         int out_features, Cublas& blas, cudaStream_t stream);

// Backward of matmul_forward, given dout (rows, out_features):
//   dinp    (rows, in_features)          =  dout @ weight          OVERWRITTEN, bf16 (nullptr: not computed)
//   dweight (out_features, in_features) +=  dout^T @ inp           ACCUMULATED, fp32
//   dbias   (out_features)              +=  sum over rows of dout  ACCUMULATED, fp32 (nullptr: no bias), deterministic
void matmul_backward(__nv_bfloat16* dinp, float* dweight, float* dbias, const __nv_bfloat16* dout,
                     const __nv_bfloat16* inp, const __nv_bfloat16* weight, int rows, int in_features, int out_features,
                     Cublas& blas, cudaStream_t stream);

}  // namespace twin::kernels::cuda

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
#include <memory>
#include <unordered_map>

#include "kernels/cuda/gemm_plan.hpp"

namespace twin::kernels::cuda {

// What cuBLASLt applies to D after the product (per row of the column-major D, i.e. per output feature).
enum class GemmEpilogue {
  None,
  Bias,           // D += bias (m), bias of D's type
  GeluAuxBias,    // aux = D + bias (the pre-activation, D's type and layout, ld aux_ld), D = gelu(aux)
  BiasGradientB,  // bias (n, fp32) = the sum of op(B) over the k dimension, WRITTEN (a weight GEMM's bias gradient)
};

// One GEMM problem: everything cuBLASLt's descriptors and choice of algorithm depend on (shapes, strides, types,
// epilogue, alignments), as plain data hashed without building a string.
struct GemmKey {
  bool trans_a = false, trans_b = false, accumulate = false;
  int m = 0, n = 0, k = 0, batch = 1;
  std::int64_t lda = 0, ldb = 0, ldd = 0, stride_a = 0, stride_b = 0, stride_d = 0, aux_ld = 0;
  int d_type = 0, epilogue = 0;
  std::uint32_t align_a = 0, align_b = 0, align_d = 0;
  bool operator==(const GemmKey& o) const {  // memberwise (the .cu files are C++17)
    return trans_a == o.trans_a && trans_b == o.trans_b && accumulate == o.accumulate && m == o.m && n == o.n &&
           k == o.k && batch == o.batch && lda == o.lda && ldb == o.ldb && ldd == o.ldd && stride_a == o.stride_a &&
           stride_b == o.stride_b && stride_d == o.stride_d && aux_ld == o.aux_ld && d_type == o.d_type &&
           epilogue == o.epilogue && align_a == o.align_a && align_b == o.align_b && align_d == o.align_d;
  }
};
struct GemmKeyHash {
  std::size_t operator()(const GemmKey& key) const;
};

// One cuBLASLt handle with its workspace and, per GEMM problem met so far, its descriptors and algorithm: built and
// chosen once (a model runs the same few dozen GEMMs every step); later calls only set the pointers. With autotuning,
// a problem's first call times the heuristic's best few algorithms on scratch output and keeps the fastest (another
// than the heuristic's first only when kAutotuneMargin faster). The choice can then differ between runs: results are
// reproducible within a process, and across processes with TWIN_CUBLASLT_AUTOTUNE=0 (the heuristic's first). A GEMM
// uses the workspace while it runs: give every stream that runs GEMMs concurrently its own Cublas (a rank with one
// compute stream needs one); not thread-safe.
class Cublas {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;  // 32 MiB: what Hopper kernels ask for
  static constexpr int kAutotuneCandidates = 4;                                 // the heuristic's best few
  static constexpr double kAutotuneMargin = 0.03;    // a switch from the heuristic's first must win by 3 %
  enum class Autotune { FromEnvironment, On, Off };  // FromEnvironment: on unless TWIN_CUBLASLT_AUTOTUNE=0
  explicit Cublas(std::size_t workspace_bytes = kDefaultWorkspaceBytes, Autotune autotune = Autotune::FromEnvironment);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  bool autotunes() const { return autotune_; }

  struct Plan;  // a problem's descriptors and algorithm, or the fact that it has none (matmul.cu)
  Plan* find(const GemmKey& key) const;
  Plan& remember(const GemmKey& key, std::unique_ptr<Plan> plan);
  std::size_t problems() const { return plans_.size(); }

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  bool autotune_ = false;
  std::unordered_map<GemmKey, std::unique_ptr<Plan>, GemmKeyHash> plans_;
};

// The generic batched GEMM every kernel of this folder uses: D = alpha op(A) op(B) + beta D as `plan` says
// (column-major, offsets and strides in elements). Types: A and B bf16; D bf16 or fp32; fp32 accumulation and scaling.
// bias and aux only with the epilogues that use them (bias is an fp32 output for BiasGradientB, a bf16 input else).
// Throws std::runtime_error naming the plan when cuBLASLt has no algorithm.
void gemm(Cublas& blas, const GemmPlan& plan, const __nv_bfloat16* a, const __nv_bfloat16* b, void* d,
          cudaDataType_t d_type, cudaStream_t stream, GemmEpilogue epilogue = GemmEpilogue::None,
          const void* bias = nullptr, __nv_bfloat16* aux = nullptr, std::int64_t aux_ld = 0);
// As gemm, but false (and nothing run) where cuBLASLt has no algorithm for the problem (an epilogue some GPUs or types
// lack): the caller then takes another path.
bool try_gemm(Cublas& blas, const GemmPlan& plan, const __nv_bfloat16* a, const __nv_bfloat16* b, void* d,
              cudaDataType_t d_type, cudaStream_t stream, GemmEpilogue epilogue = GemmEpilogue::None,
              const void* bias = nullptr, __nv_bfloat16* aux = nullptr, std::int64_t aux_ld = 0);

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
//   dweight (out_features, in_features) +=  dout^T @ inp           ACCUMULATED, fp32 (nullptr: not computed)
//   dbias   (out_features)              +=  sum over rows of dout  ACCUMULATED, fp32 (nullptr: no bias), deterministic:
//           the weight GEMM's BGRADB epilogue writes it to scratch, then it is added; where cuBLASLt has no such
//           algorithm, the column sums of elementwise.cuh's bias_backward
void matmul_backward(__nv_bfloat16* dinp, float* dweight, float* dbias, const __nv_bfloat16* dout,
                     const __nv_bfloat16* inp, const __nv_bfloat16* weight, int rows, int in_features, int out_features,
                     Cublas& blas, cudaStream_t stream);

}  // namespace twin::kernels::cuda

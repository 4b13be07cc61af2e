// cuBLASLt's FP8 GEMM (fp8.cuh): descriptors and algorithm once per problem, then per call the operands' pointers and
// their per-tensor scale pointers (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER, the inverses of the scales,
// as Transformer Engine passes scale_inv). Accumulation stays in full fp32 (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0) in
// every GEMM, so the product is the one the CPU twin's fp32 emulation computes up to the order of the sums. (TE
// promotes the backward GEMMs' sums the same way but lets the forward's accumulate fast: _2X_ACC_FPROP = False,
// _2X_ACC_DGRAD = _2X_ACC_WGRAD = True in transformer_engine/pytorch/module/base.py.)
#include <string>
#include <utility>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/lt_plan.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/matmul.cuh"

namespace twin::kernels::cuda {

struct Fp8GemmPlans::Plan : LtPlan {};

Fp8GemmPlans::Fp8GemmPlans() = default;
Fp8GemmPlans::~Fp8GemmPlans() = default;

std::size_t Fp8GemmPlans::KeyHash::operator()(const Key& key) const {
  return fnv1a_of({std::uint64_t(key.m), std::uint64_t(key.n), std::uint64_t(key.k), std::uint64_t(key.a_format),
                   std::uint64_t(key.b_format), std::uint64_t(key.d_type), std::uint64_t(key.accumulate),
                   std::uint64_t(key.bias), std::uint64_t(key.align_a), std::uint64_t(key.align_b),
                   std::uint64_t(key.align_d)});
}

namespace {

cudaDataType_t fp8_type(int format) {
  return static_cast<Fp8Format>(format) == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

void set(cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t attribute, const void* value,
         std::size_t bytes) {
  TWIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, attribute, value, bytes));
}

void make_descriptors(Fp8GemmPlans::Plan& plan, const Fp8GemmPlans::Key& key) {
  TWIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;  // "TN"
  set(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof(transposed));
  set(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain));
  const std::int8_t fast_accumulation = 0;
  set(plan.operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation, sizeof(fast_accumulation));
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    set(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    set(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
  }
  TWIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, fp8_type(key.a_format), key.k, key.m, key.k));
  TWIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, fp8_type(key.b_format), key.k, key.n, key.k));
  TWIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, static_cast<cudaDataType_t>(key.d_type), key.m, key.n, key.m));
}

// The heuristic's first algorithm, if it has one (FP8 problems have few; no autotuning here).
void choose_algorithm(Cublas& blas, Fp8GemmPlans::Plan& plan, const Fp8GemmPlans::Key& key) {
  cublasLtMatmulPreference_t preference = nullptr;
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const std::size_t workspace_bytes = blas.workspace_bytes();
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof(workspace_bytes));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const std::uint32_t*> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d}};
  for (const auto& [attribute, value] : alignments) {
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, 4);
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(blas.handle(), plan.operation, plan.a, plan.b, plan.d, plan.d, preference,
                                            1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  // Below sm_89 (no FP8 tensor cores) or for an unsupported shape the heuristic fails (NOT_SUPPORTED, or another
  // status on some versions) or finds nothing: no algorithm, the caller takes another path. (The device tests require
  // an algorithm from sm_89 on, so a wrong descriptor does not hide here.)
  if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
    plan.algorithm = result.algo;
    plan.has_algorithm = true;
  }
}

}  // namespace

Fp8GemmPlans::Plan& Fp8GemmPlans::plan_for(Cublas& blas, const Key& key) {
  const auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  make_descriptors(*plan, key);
  choose_algorithm(blas, *plan, key);
  return *(plans_[key] = std::move(plan));
}

bool try_fp8_gemm(Cublas& blas, Fp8GemmPlans& plans, int m, int n, int k, const Fp8Matrix& a, const Fp8Matrix& b,
                  void* d, cudaDataType_t d_type, bool accumulate, const __nv_bfloat16* bias, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(m > 0 && n > 0 && k > 0 && d != nullptr);
  TWIN_CUDA_REQUIRE(a.data != nullptr && b.data != nullptr && a.scale_inverse != nullptr && b.scale_inverse != nullptr);
  TWIN_CUDA_REQUIRE(d_type == CUDA_R_16BF || d_type == CUDA_R_32F);
  TWIN_CUDA_REQUIRE(bias == nullptr || d_type == CUDA_R_16BF);
  TWIN_CUDA_REQUIRE(!(a.format == Fp8Format::E5M2 && b.format == Fp8Format::E5M2));
  // FP8 tensor-core GEMMs want K and the leading dimensions in multiples of 16 elements, and 16-byte aligned operands
  if (k % 16 != 0 || m % 16 != 0 || alignment_bytes(a.data) < 16 || alignment_bytes(b.data) < 16) return false;
  Fp8GemmPlans::Key key;
  key.m = m, key.n = n, key.k = k;
  key.a_format = static_cast<int>(a.format), key.b_format = static_cast<int>(b.format);
  key.d_type = static_cast<int>(d_type), key.accumulate = accumulate, key.bias = bias != nullptr;
  key.align_a = alignment_bytes(a.data), key.align_b = alignment_bytes(b.data), key.align_d = alignment_bytes(d);
  Fp8GemmPlans::Plan& plan = plans.plan_for(blas, key);
  if (!plan.has_algorithm) return false;
  set(plan.operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scale_inverse, sizeof(a.scale_inverse));
  set(plan.operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scale_inverse, sizeof(b.scale_inverse));
  if (bias != nullptr) set(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  TWIN_CUBLAS_CHECK(cublasLtMatmul(blas.handle(), plan.operation, &alpha, a.data, plan.a, b.data, plan.b, &beta, d,
                                   plan.d, d, plan.d, &plan.algorithm, blas.workspace(), blas.workspace_bytes(),
                                   stream));
  return true;
}

}  // namespace twin::kernels::cuda

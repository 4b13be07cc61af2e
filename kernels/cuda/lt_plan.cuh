// The cuBLASLt descriptors of one GEMM problem and its algorithm (none: cuBLASLt has no algorithm for it), destroyed
// with their owner (a check may throw between creations: every path out destroys what exists). The bf16 GEMMs
// (matmul.cu) and the FP8 ones (fp8_gemm.cu) keep one per problem.
#pragma once

#include <cublasLt.h>

namespace twin::kernels::cuda {

struct LtPlan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  bool has_algorithm = false;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (operation != nullptr) cublasLtMatmulDescDestroy(operation);
  }
};

}  // namespace twin::kernels::cuda

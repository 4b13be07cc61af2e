// The cuBLASLt descriptors of one GEMM problem and its algorithm (none: cuBLASLt has no algorithm for it), destroyed
// with their owner (a check may throw between creations: every path out destroys what exists). The bf16 GEMMs
// (matmul.cu) and the FP8 ones (fp8_gemm.cu) keep one per problem.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <initializer_list>

namespace twin::kernels::cuda {

// FNV-1a over a plan key's fields: the plan caches' hash.
inline std::size_t fnv1a_of(std::initializer_list<std::uint64_t> fields) {
  std::size_t h = 1469598103934665603ull;
  for (std::uint64_t v : fields) h = (h ^ v) * 1099511628211ull;
  return h;
}

// Largest power of two (up to 256) dividing every batch entry's address: base + i * stride_bytes (0: one matrix).
// What cuBLASLt's MIN_ALIGNMENT preferences take.
inline std::uint32_t alignment_bytes(const void* base, std::int64_t stride_bytes = 0) {
  const auto address = reinterpret_cast<std::uintptr_t>(base) | static_cast<std::uintptr_t>(stride_bytes) | 256u;
  return static_cast<std::uint32_t>(address & (~address + 1));  // lowest set bit
}

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

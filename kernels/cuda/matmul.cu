#include "kernels/cuda/matmul.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace twin::kernels::cuda {

using bf16 = __nv_bfloat16;

Cublas::Cublas(std::size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  TWIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) {
    const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
    if (status != cudaSuccess) {
      cublasLtDestroy(handle_);
      TWIN_CUDA_CHECK(status);
    }
  }
}

Cublas::~Cublas() {
  if (workspace_ != nullptr) cudaFree(workspace_);  // destructors do not throw
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

namespace {

// The cuBLASLt descriptors of one call, destroyed on every path out (a check may throw between creations).
struct Descriptors {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (operation != nullptr) cublasLtMatmulDescDestroy(operation);
  }
};

std::size_t element_bytes(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_16BF:
      return 2;
    case CUDA_R_32F:
      return 4;
    default:
      throw std::invalid_argument("twin::kernels::cuda::gemm: only bf16 and fp32 matrices are used");
  }
}

// Largest power of two (up to 256) dividing every batch entry's address: base + i * stride_bytes.
std::uint32_t alignment_bytes(const void* base, std::int64_t stride_bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(base) | static_cast<std::uintptr_t>(stride_bytes) | 256u;
  return static_cast<std::uint32_t>(address & (~address + 1));  // lowest set bit
}

// A column-major (rows, cols) matrix with leading dimension ld, batched as the plan says.
void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int rows, int cols, std::int64_t ld,
                 const GemmPlan& plan, std::int64_t stride) {
  TWIN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(layout, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  if (plan.batch > 1) {
    const std::int32_t count = plan.batch;
    TWIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TWIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                       sizeof(stride)));
  }
}

std::string describe(const GemmPlan& p) {
  return "m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
         " trans_a=" + std::to_string(p.trans_a) + " trans_b=" + std::to_string(p.trans_b) +
         " lda=" + std::to_string(p.lda) + " ldb=" + std::to_string(p.ldb) + " ldd=" + std::to_string(p.ldd) +
         " batch=" + std::to_string(p.batch) + " strides=" + std::to_string(p.stride_a) + "," +
         std::to_string(p.stride_b) + "," + std::to_string(p.stride_d);
}

}  // namespace

void gemm(Cublas& blas, const GemmPlan& plan, const bf16* a, const bf16* b, void* d, cudaDataType_t d_type,
          cudaStream_t stream, GemmEpilogue epilogue, const bf16* bias, bf16* aux, std::int64_t aux_ld) {
  const GemmPlan& p = plan;
  TWIN_CUDA_REQUIRE(p.m > 0 && p.n > 0 && p.k > 0 && p.batch > 0);
  TWIN_CUDA_REQUIRE(a != nullptr && b != nullptr && d != nullptr);
  TWIN_CUDA_REQUIRE(p.lda >= (p.trans_a ? p.k : p.m) && p.ldb >= (p.trans_b ? p.n : p.k) && p.ldd >= p.m);
  TWIN_CUDA_REQUIRE(p.offset_a >= 0 && p.offset_b >= 0 && p.offset_d >= 0);
  TWIN_CUDA_REQUIRE(p.batch == 1 || (p.stride_a >= 0 && p.stride_b >= 0 && p.stride_d > 0));
  TWIN_CUDA_REQUIRE((epilogue == GemmEpilogue::None) == (bias == nullptr));
  TWIN_CUDA_REQUIRE((epilogue == GemmEpilogue::GeluAuxBias) == (aux != nullptr));
  TWIN_CUDA_REQUIRE(epilogue == GemmEpilogue::None || (p.batch == 1 && d_type == CUDA_R_16BF));
  TWIN_CUDA_REQUIRE(aux == nullptr || (aux_ld >= p.m && aux_ld % 8 == 0));
  const std::size_t d_bytes = element_bytes(d_type);
  const bf16* a_entry = a + p.offset_a;
  const bf16* b_entry = b + p.offset_b;
  void* d_entry = static_cast<char*>(d) + p.offset_d * static_cast<std::int64_t>(d_bytes);

  Descriptors desc;
  TWIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TWIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  TWIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (epilogue != GemmEpilogue::None) {
    const cublasLtEpilogue_t mode =
        epilogue == GemmEpilogue::Bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    TWIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &mode, sizeof(mode)));
    const cudaDataType_t bias_type = CUDA_R_16BF;
    TWIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof(bias_type)));
    TWIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (aux != nullptr) {
      TWIN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
      TWIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                       sizeof(aux_ld)));
    }
  }
  make_layout(&desc.a, CUDA_R_16BF, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda, p, p.stride_a);
  make_layout(&desc.b, CUDA_R_16BF, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb, p, p.stride_b);
  make_layout(&desc.d, d_type, p.m, p.n, p.ldd, p, p.stride_d);

  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.preference));
  const std::size_t workspace_bytes = blas.workspace_bytes();
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
  const std::uint32_t align_a = alignment_bytes(a_entry, p.stride_a * 2);
  const std::uint32_t align_b = alignment_bytes(b_entry, p.stride_b * 2);
  const std::uint32_t align_d = alignment_bytes(d_entry, p.stride_d * static_cast<std::int64_t>(d_bytes));
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                         &align_a, sizeof(align_a)));
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         &align_b, sizeof(align_b)));
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                         &align_d, sizeof(align_d)));
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                         &align_d, sizeof(align_d)));

  const std::string key = describe(p) + " d_type=" + std::to_string(static_cast<int>(d_type)) +
                          " epilogue=" + std::to_string(static_cast<int>(epilogue)) +
                          " aux_ld=" + std::to_string(aux_ld) + " align=" + std::to_string(align_a) + "," +
                          std::to_string(align_b) + "," + std::to_string(align_d) +
                          " beta=" + std::to_string(p.beta != 0.0f);
  const cublasLtMatmulAlgo_t* algorithm = blas.find_algorithm(key);
  if (algorithm == nullptr) {
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    TWIN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas.handle(), desc.operation, desc.a, desc.b, desc.d, desc.d,
                                                     desc.preference, 1, &heuristic, &found));
    if (found == 0) {
      throw std::runtime_error("twin::kernels::cuda::gemm: cuBLASLt has no algorithm for " + key);
    }
    blas.remember_algorithm(key, heuristic.algo);
    algorithm = blas.find_algorithm(key);
  }
  const float alpha = p.alpha;
  const float beta = p.beta;
  TWIN_CUBLAS_CHECK(cublasLtMatmul(blas.handle(), desc.operation, &alpha, a_entry, desc.a, b_entry, desc.b, &beta,
                                   d_entry, desc.d, d_entry, desc.d, algorithm, blas.workspace(),
                                   blas.workspace_bytes(), stream));
}

void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int rows, int in_features,
                    int out_features, Cublas& blas, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && in_features > 0 && out_features > 0);
  TWIN_CUDA_REQUIRE(out != nullptr && inp != nullptr && weight != nullptr);
  TWIN_CUDA_REQUIRE(out != inp && out != weight);
  // A = weight, B = inp, D = out
  gemm(blas, plan_linear_forward(rows, in_features, out_features), weight, inp, out, CUDA_R_16BF, stream,
       bias != nullptr ? GemmEpilogue::Bias : GemmEpilogue::None, bias);
}

void matmul_forward_gelu(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int rows,
                         int in_features, int out_features, Cublas& blas, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && in_features > 0 && out_features > 0);
  TWIN_CUDA_REQUIRE(out_features % 8 == 0);
  TWIN_CUDA_REQUIRE(out != nullptr && pre_gelu != nullptr && inp != nullptr && weight != nullptr && bias != nullptr);
  TWIN_CUDA_REQUIRE(out != inp && out != weight && pre_gelu != inp && pre_gelu != weight && out != pre_gelu);
  gemm(blas, plan_linear_forward(rows, in_features, out_features), weight, inp, out, CUDA_R_16BF, stream,
       GemmEpilogue::GeluAuxBias, bias, pre_gelu, out_features);
}

void matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                     int rows, int in_features, int out_features, Cublas& blas, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(rows > 0 && in_features > 0 && out_features > 0);
  // The weight is read only for the input gradient (as in the CPU twin, dinp == nullptr skips it).
  TWIN_CUDA_REQUIRE(dweight != nullptr && dout != nullptr && inp != nullptr && (dinp == nullptr || weight != nullptr));
  TWIN_CUDA_REQUIRE(dinp == nullptr || (dinp != dout && dinp != weight && dinp != inp));
  // dinp: A = weight, B = dout
  if (dinp != nullptr) {
    gemm(blas, plan_linear_backward_input(rows, in_features, out_features), weight, dout, dinp, CUDA_R_16BF, stream);
  }
  // dweight (fp32, beta = 1): A = inp, B = dout
  gemm(blas, plan_linear_backward_weight(rows, in_features, out_features), inp, dout, dweight, CUDA_R_32F, stream);
  if (dbias != nullptr) bias_backward(dbias, dout, rows, out_features, stream);
}

}  // namespace twin::kernels::cuda

#include "kernels/cuda/matmul.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/lt_plan.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using bf16 = __nv_bfloat16;

Cublas::Cublas(std::size_t workspace_bytes, Autotune autotune) : workspace_bytes_(workspace_bytes) {
  if (autotune == Autotune::FromEnvironment) {
    const char* setting = std::getenv("TWIN_CUBLASLT_AUTOTUNE");
    autotune_ = setting == nullptr || std::string_view(setting) != "0";
  } else {
    autotune_ = autotune == Autotune::On;
  }
  TWIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) {
    const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
    if (status != cudaSuccess) {
      cublasLtDestroy(handle_);
      TWIN_CUDA_CHECK(status);
    }
  }
}

struct Cublas::Plan : LtPlan {};

Cublas::~Cublas() {
  plans_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);  // destructors do not throw
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Cublas::Plan* Cublas::find(const GemmKey& key) const {
  const auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second.get();
}

Cublas::Plan& Cublas::remember(const GemmKey& key, std::unique_ptr<Plan> plan) {
  return *(plans_[key] = std::move(plan));
}

std::size_t GemmKeyHash::operator()(const GemmKey& key) const {
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  return fnv1a_of({u(key.trans_a) | u(key.trans_b) << 1 | u(key.accumulate) << 2, u(key.m), u(key.n), u(key.k),
                   u(key.batch), u(key.lda), u(key.ldb), u(key.ldd), u(key.stride_a), u(key.stride_b), u(key.stride_d),
                   u(key.aux_ld), u(key.d_type), u(key.epilogue), u(key.align_a), u(key.align_b), u(key.align_d)});
}

namespace {

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

// A column-major (rows, cols) matrix with leading dimension ld, batched as the key says.
void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int rows, int cols, std::int64_t ld,
                 const GemmKey& key, std::int64_t stride) {
  TWIN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(layout, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  if (key.batch > 1) {
    const std::int32_t count = key.batch;
    TWIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TWIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                       sizeof(stride)));
  }
}

std::string describe(const GemmKey& p) {
  return "m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
         " trans_a=" + std::to_string(p.trans_a) + " trans_b=" + std::to_string(p.trans_b) +
         " lda=" + std::to_string(p.lda) + " ldb=" + std::to_string(p.ldb) + " ldd=" + std::to_string(p.ldd) +
         " batch=" + std::to_string(p.batch) + " epilogue=" + std::to_string(p.epilogue) +
         " d_type=" + std::to_string(p.d_type);
}

cublasLtEpilogue_t epilogue_mode(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::GeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::BiasGradientB:
      return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::None:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The descriptors of a problem (pointers are set per call).
std::unique_ptr<Cublas::Plan> make_plan(const GemmKey& key) {
  auto plan = std::make_unique<Cublas::Plan>();
  TWIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TWIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  TWIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const auto epilogue = static_cast<GemmEpilogue>(key.epilogue);
  if (epilogue != GemmEpilogue::None) {
    const cublasLtEpilogue_t mode = epilogue_mode(epilogue);
    TWIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &mode, sizeof(mode)));
    const cudaDataType_t bias_type = epilogue == GemmEpilogue::BiasGradientB ? CUDA_R_32F : CUDA_R_16BF;
    TWIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof(bias_type)));
    if (epilogue == GemmEpilogue::GeluAuxBias) {
      TWIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                       &key.aux_ld, sizeof(key.aux_ld)));
    }
  }
  const auto d_type = static_cast<cudaDataType_t>(key.d_type);
  make_layout(&plan->a, CUDA_R_16BF, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k, key.lda, key,
              key.stride_a);
  make_layout(&plan->b, CUDA_R_16BF, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n, key.ldb, key,
              key.stride_b);
  make_layout(&plan->d, d_type, key.m, key.n, key.ldd, key, key.stride_d);
  return plan;
}

// The heuristic's best `count` algorithms for a problem (fewer when it knows fewer).
std::vector<cublasLtMatmulHeuristicResult_t> candidates(Cublas& blas, const GemmKey& key, const Cublas::Plan& plan,
                                                        int count) {
  cublasLtMatmulPreference_t preference = nullptr;
  TWIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int found = 0;
  const std::size_t workspace_bytes = blas.workspace_bytes();
  const cublasStatus_t status = [&] {
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const std::uint32_t*> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d}};
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes, sizeof(workspace_bytes));
    for (const auto& [attribute, value] : alignments) {
      if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, 4);
    }
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return cublasLtMatmulAlgoGetHeuristic(blas.handle(), plan.operation, plan.a, plan.b, plan.d, plan.d, preference,
                                          count, results.data(), &found);
  }();
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    found = 0;  // no algorithm for this problem (an epilogue, a type)
  else
    TWIN_CUBLAS_CHECK(status);
  results.resize(static_cast<std::size_t>(std::max(found, 0)));
  return results;
}

// Everything one call passes to cublasLtMatmul besides the plan.
struct Operands {
  const bf16 *a, *b;
  void* d;
  const void* bias;
  bf16* aux;
  float alpha, beta;
};

cublasStatus_t matmul(Cublas& blas, const Cublas::Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Operands& x,
                      cudaStream_t stream) {
  return cublasLtMatmul(blas.handle(), plan.operation, &x.alpha, x.a, plan.a, x.b, plan.b, &x.beta, x.d, plan.d, x.d,
                        plan.d, &algorithm, blas.workspace(), blas.workspace_bytes(), stream);
}

void set_pointers(const Cublas::Plan& plan, GemmEpilogue epilogue, const void* bias, bf16* aux) {
  if (epilogue == GemmEpilogue::None) return;
  TWIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (epilogue == GemmEpilogue::GeluAuxBias) {
    TWIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
}

// Times each candidate on scratch outputs (the real D, aux and bias gradient stay untouched: a weight GEMM
// accumulates into D), a warm-up then kRepeats runs each; returns the index of the one to keep: the heuristic's first
// unless another is kAutotuneMargin faster.
std::size_t fastest(Cublas& blas, const GemmKey& key, Cublas::Plan& plan,
                    const std::vector<cublasLtMatmulHeuristicResult_t>& results, Operands x, cudaStream_t stream) {
  constexpr int kRepeats = 3;
  const auto epilogue = static_cast<GemmEpilogue>(key.epilogue);
  const std::size_t d_bytes = element_bytes(static_cast<cudaDataType_t>(key.d_type)) *
                              static_cast<std::size_t>(key.stride_d * (key.batch - 1) + key.ldd * key.n);
  const std::size_t aux_bytes =
      epilogue == GemmEpilogue::GeluAuxBias ? 2 * static_cast<std::size_t>(key.aux_ld) * key.n : 0;
  const std::size_t grad_bytes = epilogue == GemmEpilogue::BiasGradientB ? 4 * static_cast<std::size_t>(key.n) : 0;
  void* scratch = nullptr;
  TWIN_CUDA_CHECK(cudaMallocAsync(&scratch, d_bytes + aux_bytes + grad_bytes + 512, stream));
  TWIN_CUDA_CHECK(cudaMemsetAsync(scratch, 0, d_bytes, stream));  // finite values for beta = 1
  auto* base = static_cast<char*>(scratch);
  x.d = base;
  if (aux_bytes > 0) x.aux = reinterpret_cast<bf16*>(base + (d_bytes + 255) / 256 * 256);
  if (grad_bytes > 0) x.bias = base + (d_bytes + aux_bytes + 511) / 256 * 256;
  set_pointers(plan, epilogue, x.bias, x.aux);
  cudaEvent_t start = nullptr, stop = nullptr;
  TWIN_CUDA_CHECK(cudaEventCreate(&start));
  TWIN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times(results.size(), -1.0f);
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (matmul(blas, plan, results[i].algo, x, stream) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up, or unusable
    TWIN_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kRepeats; ++r) TWIN_CUBLAS_CHECK(matmul(blas, plan, results[i].algo, x, stream));
    TWIN_CUDA_CHECK(cudaEventRecord(stop, stream));
    TWIN_CUDA_CHECK(cudaEventSynchronize(stop));
    TWIN_CUDA_CHECK(cudaEventElapsedTime(&times[i], start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  TWIN_CUDA_CHECK(cudaFreeAsync(scratch, stream));
  std::size_t best = 0;
  for (std::size_t i = 1; i < results.size(); ++i) {
    const bool usable = times[i] >= 0, first_usable = times[best] >= 0;
    if (usable && (!first_usable || times[i] < times[best] * (1.0 - Cublas::kAutotuneMargin))) best = i;
  }
  return best;
}

// The problem's cached plan, made (with its algorithm chosen) on its first call.
Cublas::Plan& plan_for(Cublas& blas, const GemmKey& key, const Operands& x, cudaStream_t stream) {
  if (Cublas::Plan* plan = blas.find(key)) return *plan;
  auto plan = make_plan(key);
  const auto results = candidates(blas, key, *plan, blas.autotunes() ? Cublas::kAutotuneCandidates : 1);
  if (!results.empty()) {
    const std::size_t chosen = results.size() > 1 ? fastest(blas, key, *plan, results, x, stream) : 0;
    plan->algorithm = results[chosen].algo;
    plan->has_algorithm = true;
  }
  return blas.remember(key, std::move(plan));
}

}  // namespace

bool try_gemm(Cublas& blas, const GemmPlan& plan, const bf16* a, const bf16* b, void* d, cudaDataType_t d_type,
              cudaStream_t stream, GemmEpilogue epilogue, const void* bias, bf16* aux, std::int64_t aux_ld) {
  const GemmPlan& p = plan;
  TWIN_CUDA_REQUIRE(p.m > 0 && p.n > 0 && p.k > 0 && p.batch > 0);
  TWIN_CUDA_REQUIRE(a != nullptr && b != nullptr && d != nullptr);
  TWIN_CUDA_REQUIRE(p.lda >= (p.trans_a ? p.k : p.m) && p.ldb >= (p.trans_b ? p.n : p.k) && p.ldd >= p.m);
  TWIN_CUDA_REQUIRE(p.offset_a >= 0 && p.offset_b >= 0 && p.offset_d >= 0);
  TWIN_CUDA_REQUIRE(p.batch == 1 || (p.stride_a >= 0 && p.stride_b >= 0 && p.stride_d > 0));
  TWIN_CUDA_REQUIRE((epilogue == GemmEpilogue::None) == (bias == nullptr));
  TWIN_CUDA_REQUIRE((epilogue == GemmEpilogue::GeluAuxBias) == (aux != nullptr));
  TWIN_CUDA_REQUIRE(epilogue == GemmEpilogue::None || p.batch == 1);
  TWIN_CUDA_REQUIRE(epilogue == GemmEpilogue::None ||
                    (d_type == CUDA_R_16BF) == (epilogue != GemmEpilogue::BiasGradientB));
  TWIN_CUDA_REQUIRE(aux == nullptr || (aux_ld >= p.m && aux_ld % 8 == 0));
  const std::size_t d_bytes = element_bytes(d_type);
  Operands x{a + p.offset_a,
             b + p.offset_b,
             static_cast<char*>(d) + p.offset_d * static_cast<std::int64_t>(d_bytes),
             bias,
             aux,
             p.alpha,
             p.beta};
  GemmKey key;
  key.trans_a = p.trans_a, key.trans_b = p.trans_b, key.accumulate = p.beta != 0.0f;
  key.m = p.m, key.n = p.n, key.k = p.k, key.batch = p.batch;
  key.lda = p.lda, key.ldb = p.ldb, key.ldd = p.ldd;
  key.stride_a = p.stride_a, key.stride_b = p.stride_b, key.stride_d = p.stride_d, key.aux_ld = aux_ld;
  key.d_type = static_cast<int>(d_type), key.epilogue = static_cast<int>(epilogue);
  key.align_a = alignment_bytes(x.a, p.stride_a * 2);
  key.align_b = alignment_bytes(x.b, p.stride_b * 2);
  key.align_d = alignment_bytes(x.d, p.stride_d * static_cast<std::int64_t>(d_bytes));
  Cublas::Plan& cached = plan_for(blas, key, x, stream);
  if (!cached.has_algorithm) return false;
  set_pointers(cached, epilogue, bias, aux);
  TWIN_CUBLAS_CHECK(matmul(blas, cached, cached.algorithm, x, stream));
  return true;
}

void gemm(Cublas& blas, const GemmPlan& plan, const bf16* a, const bf16* b, void* d, cudaDataType_t d_type,
          cudaStream_t stream, GemmEpilogue epilogue, const void* bias, bf16* aux, std::int64_t aux_ld) {
  if (!try_gemm(blas, plan, a, b, d, d_type, stream, epilogue, bias, aux, aux_ld)) {
    GemmKey key;
    key.m = plan.m, key.n = plan.n, key.k = plan.k, key.trans_a = plan.trans_a, key.trans_b = plan.trans_b;
    key.lda = plan.lda, key.ldb = plan.ldb, key.ldd = plan.ldd, key.batch = plan.batch;
    key.epilogue = static_cast<int>(epilogue), key.d_type = static_cast<int>(d_type);
    throw std::runtime_error("twin::kernels::cuda::gemm: cuBLASLt has no algorithm for " + describe(key));
  }
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
  TWIN_CUDA_REQUIRE(dout != nullptr && inp != nullptr && (dinp == nullptr || weight != nullptr));
  TWIN_CUDA_REQUIRE(dinp == nullptr || (dinp != dout && dinp != weight && dinp != inp));
  // dinp: A = weight, B = dout
  if (dinp != nullptr) {
    gemm(blas, plan_linear_backward_input(rows, in_features, out_features), weight, dout, dinp, CUDA_R_16BF, stream);
  }
  // dweight (fp32, beta = 1): A = inp, B = dout; dbias from the same read of dout where cuBLASLt can (BGRADB writes
  // the sum of op(B) = dout over the rows: added to dbias, which accumulates)
  if (dweight == nullptr) {  // a zero-bubble B: the weight gradient comes later, the bias's now
    if (dbias != nullptr) bias_backward(dbias, dout, rows, out_features, stream);
    return;
  }
  const GemmPlan weight_plan = plan_linear_backward_weight(rows, in_features, out_features);
  if (dbias != nullptr) {
    device::Scratch grad(static_cast<std::size_t>(out_features) * sizeof(float), stream);
    if (try_gemm(blas, weight_plan, inp, dout, dweight, CUDA_R_32F, stream, GemmEpilogue::BiasGradientB,
                 grad.as<float>())) {
      accumulate(dbias, grad.as<float>(), static_cast<std::size_t>(out_features), stream);
      return;
    }
  }
  gemm(blas, weight_plan, inp, dout, dweight, CUDA_R_32F, stream);
  if (dbias != nullptr) bias_backward(dbias, dout, rows, out_features, stream);
}

}  // namespace twin::kernels::cuda

// Linear layers, weight stored (out_features, in_features) row-major as PyTorch nn.Linear:
//   out = inp @ weight^T + bias
// Megatron tensor parallelism calls these on shards: a column-parallel linear (QKV, fc) holds out_features/tp rows of
// weight and bias; a row-parallel linear (attention proj, fc proj) holds in_features/tp columns, is called with
// bias = nullptr, and its bias is added once after the all-reduce (elementwise.hpp: bias_add, bias_backward).
// The tied LM head is matmul_forward(logits, x, wte_shard, nullptr, B*T, C, V/tp).
// GEMMs go through cblas_sgemm when built with BLAS (TWIN_HAVE_BLAS), else through a portable cache-blocked GEMM.
#pragma once

namespace twin::kernels::cpu {

// out (rows, out_features) = inp (rows, in_features) @ weight^T (in_features, out_features) + bias (out_features)
// Overwrites out. bias may be nullptr (no bias). out must not alias inp or weight.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int rows, int in_features,
                    int out_features);

// Backward of matmul_forward, given dout (rows, out_features):
//   dinp    (rows, in_features)         =  dout @ weight            OVERWRITTEN (nullptr: not computed)
//   dweight (out_features, in_features) += dout^T @ inp             ACCUMULATED (micro-batch gradient accumulation;
//                                                                  nullptr: not computed, a zero-bubble B)
//   dbias   (out_features)              += sum over rows of dout    ACCUMULATED (nullptr: the layer has no bias)
// weight is read only for dinp: it may be nullptr when dinp is. Under column parallelism dinp is a partial sum the
// caller all-reduces over the TP group.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int rows, int in_features, int out_features);

// Threads of the BLAS GEMM. Process-wide (OpenBLAS keeps one pool): when several ranks run as threads of one process,
// set 1 so that each rank's GEMM runs on its own thread. OpenBLAS's bits can depend on this count (not on timing or on
// concurrent callers): keep it fixed for a reproducible run. No effect without BLAS (the fallback is single-threaded).
void set_blas_threads(int threads);
int blas_threads();  // 1 without BLAS
bool have_blas();    // built with cblas_sgemm

// Route every GEMM through the portable GEMM even when built with BLAS (process-wide; off by default). OpenBLAS picks
// its kernel by CPU (Haswell, SkylakeX, Zen: different blockings, small-matrix paths, FMA), so its last bits, and a
// training curve that amplifies them, differ from one machine to the next; the portable GEMM sums every element over
// k in one fixed order in code compiled for baseline x86-64 (SSE2, no FMA contraction), so the same binary gives the
// same bits on every x86-64 CPU and at any thread count. Several times slower: for tests that compare numbers held to
// a tolerance set on one machine.
void set_portable_gemm(bool portable);
bool portable_gemm();

namespace detail {
// C (M, N) = beta * C + op(A) (M, K) @ op(B) (K, N), every matrix row-major and dense; op(X) = X^T when trans_x,
// i.e. A is stored (K, M) when trans_a and B is stored (N, K) when trans_b. beta is 0 (C is overwritten, may hold
// NaN) or 1. The portable, single-threaded GEMM behind matmul_* without BLAS; public so that tests compare it. On a
// CPU with AVX2 it runs the same loops compiled for AVX2 (without FMA: the same bits); allow_avx2 false: the baseline
// x86-64 code on any CPU (tests compare the two).
void gemm_portable(bool trans_a, bool trans_b, int M, int N, int K, const float* A, const float* B, float beta,
                   float* C, bool allow_avx2 = true);

// The same contract through cblas_sgemm when built with BLAS (TWIN_HAVE_BLAS) and portable_gemm() is off, else
// through gemm_portable: the one GEMM of the CPU kernels (matmul_*, attention_*).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, const float* B, float beta, float* C);
}  // namespace detail

}  // namespace twin::kernels::cpu

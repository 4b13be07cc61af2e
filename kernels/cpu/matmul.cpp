#include "kernels/cpu/matmul.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/cpu/check.hpp"

#ifdef TWIN_HAVE_BLAS
#include <cblas.h>
#endif

namespace twin::kernels::cpu {

namespace detail {
namespace {

// Goto-style blocking: a (kKc x kNc) block of op(B) stays in L2, a (kMc x kKc) block of op(A) in L1/L2, and a
// (kMr x kNr) tile of C in registers. Both blocks are packed in panels of kMr rows / kNr columns, zero-padded at the
// edges, so that the micro-kernel reads two contiguous streams. Every C element sums over k in the same order
// (k-blocks in order, k in order inside a block), whatever its position: the result is deterministic.
constexpr int kMr = 4;
constexpr int kNr = 8;
constexpr int kMc = 64;
constexpr int kKc = 256;
constexpr int kNc = 512;

// Ap: ceil(mc / kMr) panels, each (kc, kMr) with the kMr rows of op(A) interleaved per k.
void pack_a(float* Ap, bool trans_a, const float* A, int M, int K, int i0, int mc, int p0, int kc) {
  for (int ib = 0; ib < mc; ib += kMr) {
    for (int p = 0; p < kc; ++p) {
      for (int ii = 0; ii < kMr; ++ii) {
        const int i = i0 + ib + ii;
        float value = 0.0f;
        if (ib + ii < mc) {
          value = trans_a ? A[static_cast<std::size_t>(p0 + p) * M + i] : A[static_cast<std::size_t>(i) * K + p0 + p];
        }
        *Ap++ = value;
      }
    }
  }
}

// Bp: ceil(nc / kNr) panels, each (kc, kNr) with kNr columns of op(B) contiguous per k.
void pack_b(float* Bp, bool trans_b, const float* B, int N, int K, int p0, int kc, int j0, int nc) {
  for (int jb = 0; jb < nc; jb += kNr) {
    for (int p = 0; p < kc; ++p) {
      for (int jj = 0; jj < kNr; ++jj) {
        const int j = j0 + jb + jj;
        float value = 0.0f;
        if (jb + jj < nc) {
          value = trans_b ? B[static_cast<std::size_t>(j) * K + p0 + p] : B[static_cast<std::size_t>(p0 + p) * N + j];
        }
        *Bp++ = value;
      }
    }
  }
}

// kNr floats as one vector (GCC's vector extension: two SSE registers in baseline code, one AVX register in the AVX2
// entry point); its operations are element by element, each rounded as the scalar ones.
using Row = float __attribute__((vector_size(kNr * sizeof(float))));

// C tile (mr <= kMr, nr <= kNr) += Ap panel (kc, kMr) @ Bp panel (kc, kNr): acc[ii][jj] += a[ii] * b[jj], p in order.
// Always inlined, so that each entry point below compiles it for its own instruction set.
[[gnu::always_inline]] inline void micro_kernel(float* C, int ldc, int mr, int nr, const float* Ap, const float* Bp,
                                                int kc) {
  Row acc[kMr] = {};
  for (int p = 0; p < kc; ++p) {
    const float* a = Ap + p * kMr;
    Row b;
    std::memcpy(&b, Bp + p * kNr, sizeof(Row));
    for (int ii = 0; ii < kMr; ++ii) acc[ii] += a[ii] * b;
  }
  for (int ii = 0; ii < mr; ++ii) {
    float* c = C + static_cast<std::size_t>(ii) * ldc;
    for (int jj = 0; jj < nr; ++jj) c[jj] += acc[ii][jj];
  }
}

[[gnu::always_inline]] inline void blocked_gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A,
                                                const float* B, float* C) {
  // packed blocks sized for this product (at most (kMc, kKc) and (kKc, kNc + kNr)): small GEMMs, such as attention's
  // per-head blocks, do not clear a full-size buffer on every call
  const int kc_max = std::min(kKc, K);
  std::vector<float> Ap(static_cast<std::size_t>((std::min(kMc, M) + kMr - 1) / kMr * kMr) * kc_max);
  std::vector<float> Bp(static_cast<std::size_t>(kc_max) * (std::min(kNc, N) + kNr));
  for (int j0 = 0; j0 < N; j0 += kNc) {
    const int nc = std::min(kNc, N - j0);
    for (int p0 = 0; p0 < K; p0 += kKc) {
      const int kc = std::min(kKc, K - p0);
      pack_b(Bp.data(), trans_b, B, N, K, p0, kc, j0, nc);
      for (int i0 = 0; i0 < M; i0 += kMc) {
        const int mc = std::min(kMc, M - i0);
        pack_a(Ap.data(), trans_a, A, M, K, i0, mc, p0, kc);
        for (int jb = 0; jb < nc; jb += kNr) {
          for (int ib = 0; ib < mc; ib += kMr) {
            float* c = C + static_cast<std::size_t>(i0 + ib) * N + j0 + jb;
            micro_kernel(c, N, std::min(kMr, mc - ib), std::min(kNr, nc - jb), Ap.data() + ib * kc, Bp.data() + jb * kc,
                         kc);
          }
        }
      }
    }
  }
}

// The same loops for AVX2's 8-wide registers: the micro-kernel's (mr, nr) tile in one register per row. No FMA (the
// avx2 target does not include it, and nothing here asks for it): each product is rounded, then added, in the same
// order as the baseline code does, so the bits are the baseline's.
[[gnu::target("avx2")]] void blocked_gemm_avx2(bool trans_a, bool trans_b, int M, int N, int K, const float* A,
                                               const float* B, float* C) {
  blocked_gemm(trans_a, trans_b, M, N, K, A, B, C);
}

void blocked_gemm_baseline(bool trans_a, bool trans_b, int M, int N, int K, const float* A, const float* B,
                           float* C) {
  blocked_gemm(trans_a, trans_b, M, N, K, A, B, C);
}

}  // namespace

void gemm_portable(bool trans_a, bool trans_b, int M, int N, int K, const float* A, const float* B, float beta,
                   float* C, bool allow_avx2) {
  TWIN_KERNEL_CHECK(M > 0 && N > 0 && K > 0);
  TWIN_KERNEL_CHECK(A != nullptr && B != nullptr && C != nullptr);
  TWIN_KERNEL_CHECK(beta == 0.0f || beta == 1.0f);
  if (beta == 0.0f) std::fill(C, C + static_cast<std::size_t>(M) * N, 0.0f);
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && allow_avx2) {
    blocked_gemm_avx2(trans_a, trans_b, M, N, K, A, B, C);
  } else {
    blocked_gemm_baseline(trans_a, trans_b, M, N, K, A, B, C);
  }
}

namespace {
std::atomic<bool> use_portable{false};
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, const float* B, float beta, float* C) {
#ifdef TWIN_HAVE_BLAS
  if (use_portable.load(std::memory_order_relaxed)) {
    gemm_portable(trans_a, trans_b, M, N, K, A, B, beta, C);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
              trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
#else
  gemm_portable(trans_a, trans_b, M, N, K, A, B, beta, C);
#endif
}

}  // namespace detail

using detail::gemm;

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int rows, int in_features,
                    int out_features) {
  TWIN_KERNEL_CHECK(rows > 0 && in_features > 0 && out_features > 0);
  TWIN_KERNEL_CHECK(out != nullptr && inp != nullptr && weight != nullptr);
  TWIN_KERNEL_CHECK(out != inp && out != weight);
  float beta = 0.0f;
  if (bias != nullptr) {  // start from the bias, then out += inp @ weight^T
    for (int r = 0; r < rows; ++r)
      std::copy(bias, bias + out_features, out + static_cast<std::size_t>(r) * out_features);
    beta = 1.0f;
  }
  gemm(false, true, rows, out_features, in_features, inp, weight, beta, out);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int rows, int in_features, int out_features) {
  TWIN_KERNEL_CHECK(rows > 0 && in_features > 0 && out_features > 0);
  TWIN_KERNEL_CHECK(dout != nullptr && inp != nullptr);
  TWIN_KERNEL_CHECK(dinp == nullptr || weight != nullptr);  // weight is read only for dinp
  TWIN_KERNEL_CHECK(dinp == nullptr || (dinp != dout && dinp != weight && dinp != inp));
  // dinp (rows, in_features) = dout (rows, out_features) @ weight (out_features, in_features)
  if (dinp != nullptr) gemm(false, false, rows, in_features, out_features, dout, weight, 0.0f, dinp);
  // dweight (out_features, in_features) += dout^T (out_features, rows) @ inp (rows, in_features)
  if (dweight != nullptr) gemm(true, false, out_features, in_features, rows, dout, inp, 1.0f, dweight);
  // dbias (out_features) += sum_r dout[r, :], rows in order
  if (dbias != nullptr) {
    for (int r = 0; r < rows; ++r) {
      const float* dout_row = dout + static_cast<std::size_t>(r) * out_features;
      for (int o = 0; o < out_features; ++o) dbias[o] += dout_row[o];
    }
  }
}

void set_blas_threads(int threads) {
  TWIN_KERNEL_CHECK(threads >= 1);
#if defined(TWIN_HAVE_BLAS) && defined(OPENBLAS_VERSION)
  openblas_set_num_threads(threads);
#endif
}

int blas_threads() {
#if defined(TWIN_HAVE_BLAS) && defined(OPENBLAS_VERSION)
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

void set_portable_gemm(bool portable) {
  detail::use_portable.store(portable, std::memory_order_relaxed);
}

bool portable_gemm() {
  return detail::use_portable.load(std::memory_order_relaxed);
}

bool have_blas() {
#ifdef TWIN_HAVE_BLAS
  return true;
#else
  return false;
#endif
}

}  // namespace twin::kernels::cpu

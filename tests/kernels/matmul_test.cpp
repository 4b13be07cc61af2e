// matmul_forward / matmul_backward against double references, and the portable GEMM against a naive loop.
#include "kernels/cpu/matmul.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <thread>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

// out (rows, out_features) = inp @ weight^T + bias, in double
std::vector<double> matmul_reference(const std::vector<double>& inp, const std::vector<double>& weight,
                                     const std::vector<double>* bias, int rows, int in_features, int out_features) {
  std::vector<double> out(static_cast<std::size_t>(rows) * out_features);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out_features; ++o) {
      double sum = bias != nullptr ? (*bias)[o] : 0.0;
      for (int i = 0; i < in_features; ++i) sum += inp[r * in_features + i] * weight[o * in_features + i];
      out[r * out_features + o] = sum;
    }
  }
  return out;
}

TEST(CpuMatmul, ForwardMatchesDoubleReference) {
  for (bool with_bias : {true, false}) {
    const int rows = 37, in_features = 70, out_features = 29;
    const auto inp = random_vector(rows * in_features, 1);
    const auto weight = random_vector(out_features * in_features, 2);
    const auto bias = random_vector(out_features, 3);
    std::vector<float> out(rows * out_features, std::numeric_limits<float>::quiet_NaN());
    matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, rows, in_features,
                   out_features);
    const auto bias_double = to_double(bias);
    const auto want = matmul_reference(to_double(inp), to_double(weight), with_bias ? &bias_double : nullptr, rows,
                                       in_features, out_features);
    EXPECT_TRUE(all_close(out, want, 1e-5, 1e-5)) << "with_bias " << with_bias;
  }
}

TEST(CpuMatmul, BackwardMatchesFiniteDifferences) {
  const int rows = 6, in_features = 9, out_features = 7;
  const auto inp = random_vector(rows * in_features, 11);
  const auto weight = random_vector(out_features * in_features, 12);
  const auto bias = random_vector(out_features, 13);
  const auto dout = random_vector(rows * out_features, 14);

  // dweight and dbias accumulate onto what they hold; dinp is overwritten
  const auto dweight_before = random_vector(out_features * in_features, 15);
  const auto dbias_before = random_vector(out_features, 16);
  std::vector<float> dinp(rows * in_features, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> dweight = dweight_before;
  std::vector<float> dbias = dbias_before;
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), rows, in_features,
                  out_features);

  const auto x = to_double(inp), w = to_double(weight), b = to_double(bias);
  const auto dx = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(matmul_reference(v, w, &b, rows, in_features, out_features), dout);
      },
      x);
  auto dw = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(matmul_reference(x, v, &b, rows, in_features, out_features), dout);
      },
      w);
  auto db = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(matmul_reference(x, w, &v, rows, in_features, out_features), dout);
      },
      b);
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] += dweight_before[i];
  for (std::size_t i = 0; i < db.size(); ++i) db[i] += dbias_before[i];
  EXPECT_TRUE(all_close(dinp, dx, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dweight, dw, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dbias, db, 1e-5, 1e-4));
}

TEST(CpuMatmul, BackwardSkipsNullInputGradientAndBias) {
  const int rows = 4, in_features = 5, out_features = 3;
  const auto inp = random_vector(rows * in_features, 21);
  const auto weight = random_vector(out_features * in_features, 22);
  const auto dout = random_vector(rows * out_features, 23);
  std::vector<float> dweight(out_features * in_features, 0.0f);
  matmul_backward(nullptr, dweight.data(), nullptr, dout.data(), inp.data(), weight.data(), rows, in_features,
                  out_features);
  std::vector<double> want(out_features * in_features, 0.0);
  for (int o = 0; o < out_features; ++o)
    for (int i = 0; i < in_features; ++i)
      for (int r = 0; r < rows; ++r)
        want[o * in_features + i] += double(dout[r * out_features + o]) * inp[r * in_features + i];
  EXPECT_TRUE(all_close(dweight, want, 1e-6, 1e-5));
}

TEST(CpuMatmul, BackwardNeedsWeightOnlyForTheInputGradient) {
  const int rows = 4, in_features = 5, out_features = 3;
  const auto inp = random_vector(rows * in_features, 24);
  const auto weight = random_vector(out_features * in_features, 25);
  const auto dout = random_vector(rows * out_features, 26);
  std::vector<float> with_weight(out_features * in_features, 0.5f), without_weight(with_weight);
  std::vector<float> dbias_with(out_features, 0.0f), dbias_without(dbias_with);
  matmul_backward(nullptr, with_weight.data(), dbias_with.data(), dout.data(), inp.data(), weight.data(), rows,
                  in_features, out_features);
  matmul_backward(nullptr, without_weight.data(), dbias_without.data(), dout.data(), inp.data(), nullptr, rows,
                  in_features, out_features);
  EXPECT_TRUE(testing::same_bits(with_weight, without_weight));
  EXPECT_TRUE(testing::same_bits(dbias_with, dbias_without));
  std::vector<float> dinp(rows * in_features);
  EXPECT_THROW(matmul_backward(dinp.data(), without_weight.data(), nullptr, dout.data(), inp.data(), nullptr, rows,
                               in_features, out_features),
               std::invalid_argument);
}

TEST(CpuMatmul, IsDeterministic) {
  const int rows = 64, in_features = 96, out_features = 80;
  const auto inp = random_vector(rows * in_features, 31);
  const auto weight = random_vector(out_features * in_features, 32);
  const auto dout = random_vector(rows * out_features, 33);
  std::vector<float> out1(rows * out_features), out2(rows * out_features);
  matmul_forward(out1.data(), inp.data(), weight.data(), nullptr, rows, in_features, out_features);
  matmul_forward(out2.data(), inp.data(), weight.data(), nullptr, rows, in_features, out_features);
  EXPECT_TRUE(testing::same_bits(out1, out2));
  std::vector<float> dinp1(rows * in_features), dinp2(rows * in_features);
  std::vector<float> dweight1(out_features * in_features, 0.0f), dweight2(out_features * in_features, 0.0f);
  matmul_backward(dinp1.data(), dweight1.data(), nullptr, dout.data(), inp.data(), weight.data(), rows, in_features,
                  out_features);
  matmul_backward(dinp2.data(), dweight2.data(), nullptr, dout.data(), inp.data(), weight.data(), rows, in_features,
                  out_features);
  EXPECT_TRUE(testing::same_bits(dinp1, dinp2));
  EXPECT_TRUE(testing::same_bits(dweight1, dweight2));
}

// The portable GEMM, every transpose and both betas, at sizes that cross its block edges (4 x 8 tiles, 64 x 256 x 512
// blocks), against a naive double loop; and detail::gemm (BLAS when built with it), which the attention kernels call
// with every transpose.
TEST(CpuMatmul, PortableGemmMatchesNaiveLoop) {
  const int M = 70, N = 530, K = 261;
  for (bool portable : {true, false}) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          const auto A = random_vector(M * K, 41);
          const auto B = random_vector(K * N, 42);
          const auto C0 = random_vector(M * N, 43);
          std::vector<float> C = C0;
          if (beta == 0.0f) std::fill(C.begin(), C.end(), std::numeric_limits<float>::quiet_NaN());
          if (portable) {
            detail::gemm_portable(trans_a, trans_b, M, N, K, A.data(), B.data(), beta, C.data());
          } else {
            detail::gemm(trans_a, trans_b, M, N, K, A.data(), B.data(), beta, C.data());
          }
          std::vector<double> want(M * N);
          for (int i = 0; i < M; ++i) {
            for (int j = 0; j < N; ++j) {
              double sum = beta == 1.0f ? C0[i * N + j] : 0.0;
              for (int p = 0; p < K; ++p) {
                const double a = trans_a ? A[p * M + i] : A[i * K + p];
                const double b = trans_b ? B[j * K + p] : B[p * N + j];
                sum += a * b;
              }
              want[i * N + j] = sum;
            }
          }
          EXPECT_TRUE(all_close(C, want, 1e-4, 1e-5))
              << "portable " << portable << " trans_a " << trans_a << " trans_b " << trans_b << " beta " << beta;
        }
      }
    }
  }
}

// The portable GEMM's AVX2 code (used where the CPU has it) gives the baseline x86-64 code's bits, every transpose,
// at sizes that cross its blocks: what makes it the same on every x86-64 CPU.
TEST(CpuMatmul, PortableGemmIsTheSameBitsWithAndWithoutAvx2) {
  const int M = 70, N = 530, K = 300;
  const auto A = random_vector(M * K, 61), B = random_vector(K * N, 62);
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      std::vector<float> wide(M * N), baseline(M * N);
      detail::gemm_portable(trans_a, trans_b, M, N, K, A.data(), B.data(), 0.0f, wide.data(), true);
      detail::gemm_portable(trans_a, trans_b, M, N, K, A.data(), B.data(), 0.0f, baseline.data(), false);
      EXPECT_TRUE(testing::same_bits(wide, baseline)) << trans_a << " " << trans_b;
    }
  }
}

// set_portable_gemm(true) sends every GEMM (matmul_*, hence the executor's) through the portable GEMM: its bits, not
// BLAS's; off again, matmul_* is detail::gemm as built.
TEST(CpuMatmul, PortableModeRoutesEveryGemmThroughThePortableOne) {
  const int rows = 37, in = 300, out = 45;
  const auto x = random_vector(rows * in, 51), w = random_vector(out * in, 52);
  std::vector<float> portable(rows * out), routed(rows * out), built(rows * out);
  detail::gemm_portable(false, true, rows, out, in, x.data(), w.data(), 0.0f, portable.data());
  ASSERT_FALSE(portable_gemm());
  set_portable_gemm(true);
  matmul_forward(routed.data(), x.data(), w.data(), nullptr, rows, in, out);
  EXPECT_TRUE(portable_gemm());
  set_portable_gemm(false);
  detail::gemm(false, true, rows, out, in, x.data(), w.data(), 0.0f, built.data());
  EXPECT_TRUE(testing::same_bits(routed, portable));
  std::vector<float> again(rows * out);
  matmul_forward(again.data(), x.data(), w.data(), nullptr, rows, in, out);
  EXPECT_TRUE(testing::same_bits(again, built));
}

// The threaded executor runs one rank per thread, each calling the GEMM at once: same bits as one call at a time,
// whether the BLAS pool has one thread (the setting the executor uses) or two. (OpenBLAS's bits may depend on the pool
// size, so the serial result is computed with the same setting.)
TEST(CpuMatmul, ConcurrentCallsFromRankThreads) {
  const int rows = 96, in_features = 128, out_features = 160, ranks = 4;
  const auto inp = random_vector(rows * in_features, 51);
  const auto weight = random_vector(out_features * in_features, 52);
  const int threads_before = blas_threads();
  for (int blas_pool : {1, 2}) {
    set_blas_threads(blas_pool);
    std::vector<float> serial(rows * out_features);
    matmul_forward(serial.data(), inp.data(), weight.data(), nullptr, rows, in_features, out_features);
    std::vector<std::vector<float>> outs(ranks, std::vector<float>(rows * out_features));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < ranks; ++rank) {
      threads.emplace_back([&, rank] {
        for (int repeat = 0; repeat < 20; ++repeat) {
          matmul_forward(outs[rank].data(), inp.data(), weight.data(), nullptr, rows, in_features, out_features);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int rank = 0; rank < ranks; ++rank) EXPECT_TRUE(testing::same_bits(outs[rank], serial)) << "rank " << rank;
  }
  set_blas_threads(threads_before);
}

TEST(CpuMatmul, BlasThreadsAreSettable) {
  const int before = blas_threads();
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(before);
  EXPECT_THROW(set_blas_threads(0), std::invalid_argument);
}

TEST(CpuMatmul, PreconditionsNameKernelAndCondition) {
  std::vector<float> buffer(16, 0.0f);
  try {
    matmul_forward(buffer.data(), buffer.data() + 4, buffer.data() + 8, nullptr, 0, 2, 2);
    FAIL() << "rows = 0 accepted";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("matmul_forward"), std::string::npos) << message;
    EXPECT_NE(message.find("rows > 0"), std::string::npos) << message;
  }
  EXPECT_THROW(matmul_forward(buffer.data(), buffer.data(), buffer.data() + 8, nullptr, 2, 2, 2),
               std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

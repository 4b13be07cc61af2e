// Element-wise kernels, casts, GELU and AdamW on the device against their CPU twins (skipped without a GPU).
#include <gtest/gtest.h>

#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/cast.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gelu.cuh"

namespace twin::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cpu::testing::random_vector;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::normalised_error_below;
using testing::same_bits;
using testing::to_bf16;
using testing::to_float;
using testing::kBf16Tolerance;

TEST(CudaCast, BitsEqualTheCpuTwin) {
  TWIN_REQUIRE_GPU();
  const std::size_t n = 100003;  // not a multiple of any block size
  auto x = random_vector(n, 1, -100.0f, 100.0f);
  x[0] = 1e-40f, x[1] = 3.0e38f, x[2] = -0.0f;  // subnormal, overflow to inf, signed zero
  std::vector<std::uint16_t> want(n);
  cpu::cast_float_to_bf16(want.data(), x.data(), n);
  DeviceBuffer<float> d_x(x), d_back(n), d_rounded(n);
  DeviceBuffer<bf16> d_bf16(n);
  d_bf16.poison(), d_back.poison(), d_rounded.poison();
  cast_float_to_bf16(d_bf16.get(), d_x.get(), n, nullptr);
  cast_bf16_to_float(d_back.get(), d_bf16.get(), n, nullptr);
  round_to_bf16(d_rounded.get(), d_x.get(), n, nullptr);
  const auto got = d_bf16.download();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<__nv_bfloat16_raw>(got[i]).x, want[i]) << "element " << i;
  std::vector<float> want_rounded(n);
  cpu::round_to_bf16(want_rounded.data(), x.data(), n);
  EXPECT_TRUE(same_bits(d_back.download(), want_rounded));
  EXPECT_TRUE(same_bits(d_rounded.download(), want_rounded));
}

TEST(CudaElementwise, ResidualAccumulateScaleFill) {
  TWIN_REQUIRE_GPU();
  const std::size_t n = 5000;
  const auto a = bf16_rounded(random_vector(n, 2)), b = bf16_rounded(random_vector(n, 3));
  std::vector<float> want(n);
  cpu::residual_forward(want.data(), a.data(), b.data(), n);
  DeviceBuffer<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_out(n);
  d_out.poison();
  residual_forward(d_out.get(), d_a.get(), d_b.get(), n, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), want, kBf16Tolerance));

  // fp32 buffers: exact twins
  const auto y0 = random_vector(n, 4), x = random_vector(n, 5);
  auto want_y = y0;
  cpu::accumulate(want_y.data(), x.data(), n);
  cpu::scale(want_y.data(), n, 0.25f);
  DeviceBuffer<float> d_y(y0), d_x(x);
  accumulate(d_y.get(), d_x.get(), n, nullptr);
  scale(d_y.get(), n, 0.25f, nullptr);
  EXPECT_TRUE(same_bits(d_y.download(), want_y));
  fill(d_y.get(), n, 1.5f, nullptr);
  EXPECT_TRUE(same_bits(d_y.download(), std::vector<float>(n, 1.5f)));
  DeviceBuffer<float> d_copy(n);
  copy(d_copy.get(), d_x.get(), n, nullptr);
  EXPECT_TRUE(same_bits(d_copy.download(), x));

  // bf16 accumulate: the gradient of the residual stream
  auto want_acc = a;
  cpu::accumulate(want_acc.data(), b.data(), n);
  accumulate(d_a.get(), d_b.get(), n, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_a.download()), want_acc, kBf16Tolerance));
}

TEST(CudaElementwise, BiasAddAndDeterministicBiasBackward) {
  TWIN_REQUIRE_GPU();
  for (auto [rows, channels] : {std::pair{1, 1}, std::pair{70, 33}, std::pair{1000, 768}}) {
    const std::size_t n = static_cast<std::size_t>(rows) * channels;
    const auto out0 = bf16_rounded(random_vector(n, 6)), bias = bf16_rounded(random_vector(channels, 7));
    auto want = out0;
    cpu::bias_add(want.data(), bias.data(), rows, channels);
    DeviceBuffer<bf16> d_out(to_bf16(out0)), d_bias(to_bf16(bias));
    bias_add(d_out.get(), d_bias.get(), rows, channels, nullptr);
    EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), want, kBf16Tolerance)) << rows << "x" << channels;

    const auto dout = bf16_rounded(random_vector(n, 8));
    const auto dbias0 = random_vector(channels, 9);
    auto want_dbias = dbias0;
    cpu::bias_backward(want_dbias.data(), dout.data(), rows, channels);
    DeviceBuffer<bf16> d_dout(to_bf16(dout));
    DeviceBuffer<float> d_dbias(dbias0), d_dbias_again(dbias0);
    bias_backward(d_dbias.get(), d_dout.get(), rows, channels, nullptr);
    bias_backward(d_dbias_again.get(), d_dout.get(), rows, channels, nullptr);
    const auto got = d_dbias.download();
    EXPECT_TRUE(normalised_error_below(got, want_dbias, 1e-5)) << rows << "x" << channels;
    EXPECT_TRUE(same_bits(got, d_dbias_again.download())) << "deterministic";
  }
}

TEST(CudaElementwise, SquaredNormAndSumInDouble) {
  TWIN_REQUIRE_GPU();
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{3000017}}) {
    const auto x = random_vector(n, 10);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<double> d_result(2);
    squared_norm(d_result.get(), d_x.get(), n, nullptr);
    sum(d_result.get() + 1, d_x.get(), n, nullptr);
    const auto got = d_result.download();
    double want_sum = 0.0;
    for (float v : x) want_sum += v;
    EXPECT_NEAR(got[0], cpu::squared_norm(x.data(), n), 1e-12 * static_cast<double>(n)) << n;
    EXPECT_NEAR(got[1], want_sum, 1e-12 * static_cast<double>(n)) << n;
  }
}

TEST(CudaGelu, ForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const std::size_t n = 40000;
  const auto x = bf16_rounded(random_vector(n, 11, -6.0f, 6.0f)), dout = bf16_rounded(random_vector(n, 12));
  std::vector<float> want(n), want_dinp(n);
  cpu::gelu_forward(want.data(), x.data(), n);
  cpu::gelu_backward(want_dinp.data(), x.data(), dout.data(), n);
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_dout(to_bf16(dout)), d_out(n), d_dinp(n);
  d_out.poison(), d_dinp.poison();
  gelu_forward(d_out.get(), d_x.get(), n, nullptr);
  gelu_backward(d_dinp.get(), d_x.get(), d_dout.get(), n, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), want, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(to_float(d_dinp.download()), want_dinp, kBf16Tolerance));
}

TEST(CudaAdamW, Fp32AndMasterWeightsHaveTheCpuTwinsBits) {
  TWIN_REQUIRE_GPU();
  const std::size_t n = 12345;
  const auto param0 = random_vector(n, 13), grad = random_vector(n, 14);
  auto want = param0, m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
  DeviceBuffer<float> d_param(param0), d_master(param0), d_grad(grad), d_m(m), d_v(v), d_m2(m), d_v2(v);
  DeviceBuffer<bf16> d_working(n);
  for (int step = 1; step <= 3; ++step) {
    cpu::adamw_update(want.data(), grad.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f);
    adamw_update(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f,
                 nullptr);
    adamw_update(d_working.get(), d_master.get(), d_grad.get(), d_m2.get(), d_v2.get(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                 0.1f, step, 0.7f, nullptr);
  }
  EXPECT_TRUE(same_bits(d_param.download(), want));
  EXPECT_TRUE(same_bits(d_master.download(), want));
  EXPECT_TRUE(same_bits(d_m.download(), m));
  EXPECT_TRUE(same_bits(d_v2.download(), v));
  EXPECT_TRUE(same_bits(to_float(d_working.download()), bf16_rounded(want)));
}

}  // namespace
}  // namespace twin::kernels::cuda

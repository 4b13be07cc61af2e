// cuBLASLt linear layers (bias and GELU epilogues) and causal attention on the device against their CPU twins
// (skipped without a GPU). Inputs are bf16-rounded for both sides: what differs is fp32 accumulation order and the
// bf16 rounding of the device's outputs (and, in attention, of the probabilities fed to the second GEMM).
#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/matmul.cuh"

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

struct LinearCase {
  int rows, in_features, out_features;
};
std::ostream& operator<<(std::ostream& out, const LinearCase& c) {
  return out << "rows " << c.rows << " in " << c.in_features << " out " << c.out_features;
}

class CudaMatmul : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CudaMatmul, ForwardEpiloguesAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const auto [rows, in_f, out_f] = GetParam();
  const auto inp = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * in_f, 1));
  const auto weight = bf16_rounded(random_vector(static_cast<std::size_t>(out_f) * in_f, 2, -0.1f, 0.1f));
  const auto bias = bf16_rounded(random_vector(out_f, 3));
  const std::size_t out_count = static_cast<std::size_t>(rows) * out_f;
  Cublas blas;
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_weight(to_bf16(weight)), d_bias(to_bf16(bias));
  DeviceBuffer<bf16> d_out(out_count), d_out_no_bias(out_count);
  d_out.poison(), d_out_no_bias.poison();
  matmul_forward(d_out.get(), d_inp.get(), d_weight.get(), d_bias.get(), rows, in_f, out_f, blas, nullptr);
  matmul_forward(d_out_no_bias.get(), d_inp.get(), d_weight.get(), nullptr, rows, in_f, out_f, blas, nullptr);
  std::vector<float> want(out_count), want_no_bias(out_count);
  cpu::matmul_forward(want.data(), inp.data(), weight.data(), bias.data(), rows, in_f, out_f);
  cpu::matmul_forward(want_no_bias.data(), inp.data(), weight.data(), nullptr, rows, in_f, out_f);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), want, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(to_float(d_out_no_bias.download()), want_no_bias, kBf16Tolerance));

  if (out_f % 8 == 0) {  // the GELU epilogue: pre-activation and activation
    DeviceBuffer<bf16> d_gelu(out_count), d_pre(out_count);
    d_gelu.poison(), d_pre.poison();
    matmul_forward_gelu(d_gelu.get(), d_pre.get(), d_inp.get(), d_weight.get(), d_bias.get(), rows, in_f, out_f, blas,
                        nullptr);
    std::vector<float> want_gelu(out_count);
    cpu::gelu_forward(want_gelu.data(), want.data(), out_count);
    EXPECT_TRUE(normalised_error_below(to_float(d_pre.download()), want, kBf16Tolerance));
    EXPECT_TRUE(normalised_error_below(to_float(d_gelu.download()), want_gelu, kBf16Tolerance));
  }

  // backward: dinp overwritten (bf16), dweight and dbias accumulated (fp32)
  const auto dout = bf16_rounded(random_vector(out_count, 4));
  const auto dweight0 = random_vector(static_cast<std::size_t>(out_f) * in_f, 5), dbias0 = random_vector(out_f, 6);
  std::vector<float> dinp(static_cast<std::size_t>(rows) * in_f);
  auto dweight = dweight0, dbias = dbias0;
  cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), rows, in_f,
                       out_f);
  DeviceBuffer<bf16> d_dout(to_bf16(dout)), d_dinp(dinp.size());
  DeviceBuffer<float> d_dweight(dweight0), d_dbias(dbias0), d_dweight_again(dweight0);
  d_dinp.poison();
  matmul_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(), d_weight.get(), rows, in_f,
                  out_f, blas, nullptr);
  matmul_backward(nullptr, d_dweight_again.get(), nullptr, d_dout.get(), d_inp.get(), d_weight.get(), rows, in_f, out_f,
                  blas, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_dinp.download()), dinp, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(d_dweight.download(), dweight, 1e-4));
  EXPECT_TRUE(normalised_error_below(d_dbias.download(), dbias, 1e-5));
  EXPECT_TRUE(same_bits(d_dweight_again.download(), d_dweight.download())) << "deterministic, dinp skipped";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMatmul,
                         ::testing::Values(LinearCase{1, 1, 1}, LinearCase{37, 70, 29}, LinearCase{64, 128, 384},
                                           LinearCase{256, 768, 3072}, LinearCase{300, 3072, 768}));

struct AttentionCase {
  int batch, seq, heads, head_dim;
};
std::ostream& operator<<(std::ostream& out, const AttentionCase& c) {
  return out << "B " << c.batch << " T " << c.seq << " H " << c.heads << " D " << c.head_dim;
}

class CudaAttention : public ::testing::TestWithParam<AttentionCase> {};

// The device forward and backward against the CPU twin on bf16-rounded inputs drawn from `seed`, with the `slopes`
// of ALiBi for the H heads (empty: none; the device gets them as its fp32 slopes).
void expect_attention_matches_cpu_twin(const AttentionCase& c, const std::vector<float>& slopes, unsigned seed) {
  const auto [B, T, H, D] = c;
  const std::size_t qkv_count = static_cast<std::size_t>(B) * T * 3 * H * D;
  const std::size_t out_count = static_cast<std::size_t>(B) * T * H * D;
  const std::size_t lse_count = static_cast<std::size_t>(B) * H * T;
  const float* host_slopes = slopes.empty() ? nullptr : slopes.data();
  const auto qkv = bf16_rounded(random_vector(qkv_count, seed, -2.0f, 2.0f));
  const auto dout = bf16_rounded(random_vector(out_count, seed + 1));
  std::vector<float> out(out_count), lse(lse_count), dqkv(qkv_count);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, D, host_slopes);
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, D, host_slopes);

  Cublas blas;
  DeviceBuffer<bf16> d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout)), d_out(out_count), d_dqkv(qkv_count);
  DeviceBuffer<float> d_lse(lse_count);
  std::optional<DeviceBuffer<float>> d_slopes;
  if (!slopes.empty()) d_slopes.emplace(slopes);
  const float* device_slopes = d_slopes ? d_slopes->get() : nullptr;
  d_out.poison(), d_lse.poison(), d_dqkv.poison();
  attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), B, T, H, D, blas, nullptr, device_slopes);
  attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_lse.get(), B, T, H, D, blas, nullptr, device_slopes);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, 1e-2));
  EXPECT_TRUE(normalised_error_below(d_lse.download(), lse, 1e-5));
  EXPECT_TRUE(normalised_error_below(to_float(d_dqkv.download()), dqkv, 2e-2));
}

TEST_P(CudaAttention, ForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  expect_attention_matches_cpu_twin(GetParam(), {}, 7);
}

// ALiBi under tensor parallelism 2: a model of 2H heads, each rank's H heads with the slopes of their global indices
// (alibi_slopes(2H) from rank * H on) uploaded as the device twin's fp32 slopes, the CPU twin given the same H floats.
// Rank 0 holds the steeper slopes (from 1/4 at 4 model heads), rank 1 the gentler ones. Same tolerances as without.
TEST_P(CudaAttention, AlibiForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const int H = GetParam().heads;
  const auto model_slopes = cpu::alibi_slopes(2 * H);
  for (const int rank : {0, 1}) {  // tensor parallel 2: each rank's H heads, slopes from its first global head
    SCOPED_TRACE(rank);
    const std::vector<float> slopes(model_slopes.begin() + rank * H, model_slopes.begin() + (rank + 1) * H);
    expect_attention_matches_cpu_twin(GetParam(), slopes, 9);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttentionCase{1, 1, 1, 8}, AttentionCase{2, 7, 3, 16},
                                           AttentionCase{2, 64, 4, 32}, AttentionCase{1, 300, 2, 64},
                                           AttentionCase{1, 512, 4, 128}));

}  // namespace
}  // namespace twin::kernels::cuda

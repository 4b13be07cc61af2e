// The kernels of a Llama-style block on the device against their CPU twins (skipped without a GPU): RMSNorm, SwiGLU,
// rotary embeddings and grouped-query attention, forward and backward, on bf16-rounded inputs for both sides. What
// differs is fp32 accumulation order and the bf16 rounding of the device's outputs (and, in attention, of the
// probabilities fed to the second GEMM). Host preconditions are checked on any machine.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

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
using testing::Rows;

// --- RMSNorm ---------------------------------------------------------------------------------------------------------

class CudaRmsNorm : public ::testing::TestWithParam<Rows> {};

TEST_P(CudaRmsNorm, ForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const auto [rows, C] = GetParam();
  const std::size_t n = static_cast<std::size_t>(rows) * C;
  const auto inp = bf16_rounded(random_vector(n, 1, -2.0f, 3.0f));
  const auto weight = bf16_rounded(random_vector(C, 3, 0.5f, 1.5f));
  std::vector<float> out(n), rstd(rows);
  cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), rows, C);

  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_weight(to_bf16(weight)), d_out(n);
  DeviceBuffer<float> d_rstd(rows);
  d_out.poison(), d_rstd.poison();
  rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), rows, C, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(d_rstd.download(), rstd, 1e-5));

  // backward: dinp and dweight accumulate onto what they hold
  const auto dout = bf16_rounded(random_vector(n, 5));
  const auto dinp0 = bf16_rounded(random_vector(n, 6));
  const auto dweight0 = random_vector(C, 7);
  auto dinp = dinp0, dweight = dweight0;
  cpu::rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), rows, C);
  DeviceBuffer<bf16> d_dout(to_bf16(dout)), d_dinp(to_bf16(dinp0));
  DeviceBuffer<float> d_dweight(dweight0), d_dweight_again(dweight0);
  rmsnorm_backward(d_dinp.get(), d_dweight.get(), d_dout.get(), d_inp.get(), d_weight.get(), d_rstd.get(), rows, C,
                   nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_dinp.download()), dinp, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(d_dweight.download(), dweight, 1e-4));
  // deterministic: the weight gradient of a second call on the same inputs has the same bits
  DeviceBuffer<bf16> d_dinp_again(to_bf16(dinp0));
  rmsnorm_backward(d_dinp_again.get(), d_dweight_again.get(), d_dout.get(), d_inp.get(), d_weight.get(), d_rstd.get(),
                   rows, C, nullptr);
  EXPECT_TRUE(same_bits(d_dweight_again.download(), d_dweight.download()));
  EXPECT_TRUE(same_bits(to_float(d_dinp_again.download()), to_float(d_dinp.download())));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaRmsNorm,
                         ::testing::Values(Rows{1, 1}, Rows{3, 31}, Rows{17, 100}, Rows{130, 768}, Rows{64, 2048}));

// --- SwiGLU ----------------------------------------------------------------------------------------------------------

class CudaSwiglu : public ::testing::TestWithParam<Rows> {};

TEST_P(CudaSwiglu, ForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const auto [rows, width] = GetParam();
  const std::size_t n = static_cast<std::size_t>(rows) * width;
  auto inp = random_vector(2 * n, 11, -6.0f, 6.0f);                          // rows of [gate | up]
  const float extremes[] = {-100.0f, -88.0f, -20.0f, 20.0f, 88.0f, 100.0f};  // saturated sigmoids: finite
  for (std::size_t i = 0; i < std::size(extremes) && i < 2 * n; ++i) inp[i] = extremes[i];
  inp = bf16_rounded(inp);
  const auto dout = bf16_rounded(random_vector(n, 12));
  std::vector<float> out(n), dinp(2 * n);
  cpu::swiglu_forward(out.data(), inp.data(), rows, width);
  cpu::swiglu_backward(dinp.data(), inp.data(), dout.data(), rows, width);

  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_dout(to_bf16(dout)), d_out(n), d_dinp(2 * n);
  d_out.poison(), d_dinp.poison();  // dinp is overwritten, every element of it
  swiglu_forward(d_out.get(), d_inp.get(), rows, width, nullptr);
  swiglu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), rows, width, nullptr);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, kBf16Tolerance));
  EXPECT_TRUE(normalised_error_below(to_float(d_dinp.download()), dinp, kBf16Tolerance));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSwiglu,
                         ::testing::Values(Rows{1, 1}, Rows{3, 31}, Rows{17, 100}, Rows{130, 768}, Rows{64, 2752}));

// --- rotary embeddings -----------------------------------------------------------------------------------------------

struct RopeCase {
  int batch, seq, heads, kv_heads, head_dim;
};
std::ostream& operator<<(std::ostream& out, const RopeCase& c) {
  return out << "B " << c.batch << " T " << c.seq << " H " << c.heads << " KV " << c.kv_heads << " D " << c.head_dim;
}

class CudaRope : public ::testing::TestWithParam<RopeCase> {};

// In place on q and k, v untouched. The angles are the CPU twin's (double, each cos / sin rounded once) and the
// rotation its fp32 operations, so the device's bf16 results are the CPU twin's fp32 results rounded, but where the
// device's double cos or sin rounds to another fp32 than the host's (a 2-ulp tie in double: next to never).
TEST_P(CudaRope, ForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const auto [B, T, H, KV, D] = GetParam();
  const std::size_t row = static_cast<std::size_t>(H + 2 * KV) * D;
  const std::size_t count = static_cast<std::size_t>(B) * T * row;
  const auto qkv = bf16_rounded(random_vector(count, 21, -2.0f, 2.0f));
  for (const bool forward : {true, false}) {
    SCOPED_TRACE(forward ? "forward" : "backward");
    auto want = qkv;
    DeviceBuffer<bf16> d_qkv(to_bf16(qkv));
    if (forward) {
      cpu::rope_forward(want.data(), B, T, H, KV, D);
      rope_forward(d_qkv.get(), B, T, H, KV, D, nullptr);
    } else {
      cpu::rope_backward(want.data(), B, T, H, KV, D);
      rope_backward(d_qkv.get(), B, T, H, KV, D, nullptr);
    }
    const auto got = to_float(d_qkv.download());
    EXPECT_TRUE(normalised_error_below(got, want, kBf16Tolerance));
    const auto want_rounded = bf16_rounded(want);
    std::size_t differing = 0, v_changed = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (got[i] != want_rounded[i]) ++differing;
      const bool in_v = i % row >= static_cast<std::size_t>(H + KV) * D;
      if (in_v && got[i] != qkv[i]) ++v_changed;
    }
    EXPECT_LE(differing, count / 1000) << "elements not the CPU twin's, rounded";
    EXPECT_EQ(v_changed, 0u) << "v is never written";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaRope,
                         ::testing::Values(RopeCase{1, 1, 1, 1, 2}, RopeCase{2, 7, 3, 3, 16}, RopeCase{2, 64, 4, 2, 32},
                                           RopeCase{1, 300, 8, 1, 64}, RopeCase{1, 2048, 4, 2, 128}));

// --- grouped-query attention ---------------------------------------------------------------------------------------

struct GqaCase {
  int batch, seq, heads, kv_heads, head_dim;
};
std::ostream& operator<<(std::ostream& out, const GqaCase& c) {
  return out << "B " << c.batch << " T " << c.seq << " H " << c.heads << " KV " << c.kv_heads << " D " << c.head_dim;
}

class CudaGroupedAttention : public ::testing::TestWithParam<GqaCase> {};

// The device forward and backward against the CPU twin on bf16-rounded inputs drawn from `seed`, with the `slopes`
// of ALiBi for the H query heads (empty: none). The same tolerances as multi-head attention's test; the backward is
// run twice and must give the same bits (dk and dv summed over the group in a fixed order).
void expect_gqa_matches_cpu_twin(const GqaCase& c, const std::vector<float>& slopes, unsigned seed) {
  const auto [B, T, H, KV, D] = c;
  const std::size_t qkv_count = static_cast<std::size_t>(B) * T * (H + 2 * KV) * D;
  const std::size_t out_count = static_cast<std::size_t>(B) * T * H * D;
  const std::size_t lse_count = static_cast<std::size_t>(B) * H * T;
  const float* host_slopes = slopes.empty() ? nullptr : slopes.data();
  const auto qkv = bf16_rounded(random_vector(qkv_count, seed, -2.0f, 2.0f));
  const auto dout = bf16_rounded(random_vector(out_count, seed + 1));
  std::vector<float> out(out_count), lse(lse_count), dqkv(qkv_count);
  cpu::attention_forward_gqa(out.data(), lse.data(), qkv.data(), B, T, H, KV, D, host_slopes);
  cpu::attention_backward_gqa(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, H, KV, D, host_slopes);

  Cublas blas;
  DeviceBuffer<bf16> d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout)), d_out(out_count), d_dqkv(qkv_count),
      d_dqkv_again(qkv_count);
  DeviceBuffer<float> d_lse(lse_count);
  std::optional<DeviceBuffer<float>> d_slopes;
  if (!slopes.empty()) d_slopes.emplace(slopes);
  const float* device_slopes = d_slopes ? d_slopes->get() : nullptr;
  d_out.poison(), d_lse.poison(), d_dqkv.poison(), d_dqkv_again.poison();  // dqkv is overwritten as a whole
  attention_forward_gqa(d_out.get(), d_lse.get(), d_qkv.get(), B, T, H, KV, D, blas, nullptr, device_slopes);
  attention_backward_gqa(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_lse.get(), B, T, H, KV, D, blas, nullptr,
                         device_slopes);
  attention_backward_gqa(d_dqkv_again.get(), d_dout.get(), d_qkv.get(), d_lse.get(), B, T, H, KV, D, blas, nullptr,
                         device_slopes);
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, 1e-2));
  EXPECT_TRUE(normalised_error_below(d_lse.download(), lse, 1e-5));
  const auto got_dqkv = to_float(d_dqkv.download());
  EXPECT_TRUE(normalised_error_below(got_dqkv, dqkv, 2e-2));
  EXPECT_TRUE(same_bits(to_float(d_dqkv_again.download()), got_dqkv)) << "deterministic";
}

TEST_P(CudaGroupedAttention, ForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  expect_gqa_matches_cpu_twin(GetParam(), {}, 7);
}

TEST_P(CudaGroupedAttention, AlibiForwardAndBackwardMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  expect_gqa_matches_cpu_twin(GetParam(), cpu::alibi_slopes(GetParam().heads), 9);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGroupedAttention,
                         ::testing::Values(GqaCase{1, 1, 2, 1, 8}, GqaCase{2, 7, 4, 2, 16}, GqaCase{2, 64, 6, 3, 32},
                                           GqaCase{1, 300, 4, 1, 64}, GqaCase{1, 256, 8, 2, 128},
                                           GqaCase{2, 33, 3, 3, 16}));  // the last: kv_heads == heads (MHA's path)

// With kv_heads == heads the grouped functions are multi-head attention's, bit for bit.
TEST(CudaGroupedAttentionTest, WithAsManyKvHeadsAsHeadsItIsMultiHeadAttention) {
  TWIN_REQUIRE_GPU();
  const int B = 2, T = 20, H = 4, D = 16;
  const std::size_t qkv_count = static_cast<std::size_t>(B) * T * 3 * H * D, out_count = qkv_count / 3;
  const auto qkv = bf16_rounded(random_vector(qkv_count, 41, -2.0f, 2.0f));
  const auto dout = bf16_rounded(random_vector(out_count, 42));
  Cublas blas;
  DeviceBuffer<bf16> d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout)), d_out(out_count), d_out_gqa(out_count),
      d_dqkv(qkv_count), d_dqkv_gqa(qkv_count);
  DeviceBuffer<float> d_lse(static_cast<std::size_t>(B) * H * T), d_lse_gqa(static_cast<std::size_t>(B) * H * T);
  attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), B, T, H, D, blas, nullptr);
  attention_forward_gqa(d_out_gqa.get(), d_lse_gqa.get(), d_qkv.get(), B, T, H, H, D, blas, nullptr);
  attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_lse.get(), B, T, H, D, blas, nullptr);
  attention_backward_gqa(d_dqkv_gqa.get(), d_dout.get(), d_qkv.get(), d_lse.get(), B, T, H, H, D, blas, nullptr);
  EXPECT_TRUE(same_bits(to_float(d_out_gqa.download()), to_float(d_out.download())));
  EXPECT_TRUE(same_bits(d_lse_gqa.download(), d_lse.download()));
  EXPECT_TRUE(same_bits(to_float(d_dqkv_gqa.download()), to_float(d_dqkv.download())));
}

// --- host preconditions, on any machine: they throw before any launch ------------------------------------------------

TEST(CudaLlamaPreconditions, ThrowBeforeAnyLaunch) {
  EXPECT_THROW(rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8, nullptr),
               std::invalid_argument);
  EXPECT_THROW(swiglu_forward(nullptr, nullptr, 4, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(swiglu_backward(nullptr, nullptr, nullptr, 4, 8, nullptr), std::invalid_argument);
  // an odd head_dim cannot be split into halves; a base <= 0 or NaN has no angles
  auto* fake = reinterpret_cast<bf16*>(std::uintptr_t{256});  // never dereferenced: the checks throw first
  EXPECT_THROW(rope_forward(fake, 1, 4, 2, 1, 7, nullptr), std::invalid_argument);
  EXPECT_THROW(rope_backward(fake, 1, 4, 2, 1, 8, nullptr, 0.0f), std::invalid_argument);
  EXPECT_THROW(rope_forward(fake, 1, 4, 2, 0, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(rope_forward(fake, 1, 4, 2, 1, 8, nullptr, 10000.0f, 6 + 4), std::invalid_argument);  // past the head
  EXPECT_THROW(rope_backward(fake, 1, 4, 2, 1, 8, nullptr, 10000.0f, 3), std::invalid_argument);     // half a pair
  try {
    rope_forward(fake, 1, 4, 2, 1, 7, nullptr);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("twin::kernels::cuda::rope_forward: precondition failed: rotary_dim > 0 && "
                                         "rotary_dim <= head_dim && rotary_dim % 2 == 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace twin::kernels::cuda

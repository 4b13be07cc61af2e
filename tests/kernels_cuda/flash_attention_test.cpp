// The fused attention kernels (kernels/cuda/flash_attention.cuh) against their CPU mirror of the same tiles
// (kernels/cpu/flash_attention.hpp), on bf16-rounded inputs, causal, grouped-query and ALiBi shapes of every head size
// they are built for, ending in partial tiles (skipped without a GPU); their results against the unfused device path
// (attention.cuh, the reference kept); every output written, and the same bits twice. Their launch shapes on any
// machine.
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/launch.hpp"
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

// --- on any machine -------------------------------------------------------------------------------------------------

TEST(CudaFlashLaunch, TilesAreTheCpuMirrorsAndSharedMemoryFitsAnSm) {
  EXPECT_EQ(launch::kFlashQueryTile, cpu::kFlashQueryTile);
  EXPECT_EQ(launch::kFlashKeyTile, cpu::kFlashKeyTile);
  for (int d : {32, 64, 96, 128}) {
    EXPECT_EQ(launch::flash_backward_query_tile(d), cpu::flash_backward_query_tile(d));
    const launch::FlashShape s = launch::flash_shape(2, 2048, 16, 4, d);
    EXPECT_EQ(s.query_tiles, 32u);
    EXPECT_EQ(s.key_tiles, 32u);
    EXPECT_EQ(s.query_heads, 32u);
    EXPECT_EQ(s.kv_heads, 8u);
    EXPECT_LE(s.dq_smem_bytes, 100u * 1024);  // A100: 164 KB per SM, H100: 228 KB: at least one block, with room
  }
  const launch::FlashShape s128 = launch::flash_shape(1, 100, 4, 4, 128);
  EXPECT_EQ(s128.query_tiles, 2u);                        // 64 + 36 queries
  EXPECT_EQ(s128.forward_smem_bytes, 3u * 64 * 136 * 2);  // Q, K, V tiles, rows of 128 + 8 bf16
  EXPECT_EQ(s128.dkdv_smem_bytes, (2u * 64 + 2 * 32) * 136 * 2 + 2 * 32 * 4);
  EXPECT_THROW(launch::flash_shape(1, 100, 4, 4, 80), std::invalid_argument);
  EXPECT_THROW(launch::flash_shape(1, 100, 6, 4, 64), std::invalid_argument);
  EXPECT_FALSE(flash_attention_supports(160));
  EXPECT_TRUE(flash_attention_supports(64));
}

// --- with a GPU -----------------------------------------------------------------------------------------------------

struct FlashCase {
  int B, T, H, KV, D;
  bool alibi;
  std::size_t qkv() const { return static_cast<std::size_t>(B) * T * (H + 2 * KV) * D; }
  std::size_t out() const { return static_cast<std::size_t>(B) * T * H * D; }
  std::size_t lse() const { return static_cast<std::size_t>(B) * H * T; }
};
std::ostream& operator<<(std::ostream& out, const FlashCase& c) {
  return out << "B " << c.B << " T " << c.T << " H " << c.H << " KV " << c.KV << " D " << c.D
             << (c.alibi ? " alibi" : "");
}

class CudaFlashAttention : public ::testing::TestWithParam<FlashCase> {};

TEST_P(CudaFlashAttention, ForwardAndBackwardMatchTheCpuMirror) {
  TWIN_REQUIRE_GPU();
  const FlashCase x = GetParam();
  const auto qkv = bf16_rounded(random_vector(x.qkv(), 61, -1.5f, 1.5f));
  const auto dout = bf16_rounded(random_vector(x.out(), 62));
  const std::vector<float> all_slopes = cpu::alibi_slopes(2 * x.H);  // this rank's heads: the second half
  const std::vector<float> slopes(all_slopes.begin() + x.H, all_slopes.end());
  const float* host_slopes = x.alibi ? slopes.data() : nullptr;

  // the CPU mirror: forward, then the backward from its own (bf16-rounded, as the device keeps it) output
  std::vector<float> want_out(x.out()), want_lse(x.lse()), want_dqkv(x.qkv());
  cpu::flash_attention_forward(want_out.data(), want_lse.data(), qkv.data(), x.B, x.T, x.H, x.KV, x.D, host_slopes);
  const auto out_rounded = bf16_rounded(want_out);
  cpu::flash_attention_backward(want_dqkv.data(), dout.data(), qkv.data(), out_rounded.data(), want_lse.data(), x.B,
                                x.T, x.H, x.KV, x.D, host_slopes);

  DeviceBuffer<bf16> d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout)), d_out(x.out()), d_dqkv(x.qkv());
  DeviceBuffer<float> d_lse(x.lse()), d_slopes(slopes);
  d_out.poison(), d_lse.poison(), d_dqkv.poison();
  const float* device_slopes = x.alibi ? d_slopes.get() : nullptr;
  flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), x.B, x.T, x.H, x.KV, x.D, nullptr, device_slopes);
  const auto out = to_float(d_out.download());
  const auto lse = d_lse.download();
  EXPECT_TRUE(normalised_error_below(out, want_out, 1e-2));
  EXPECT_TRUE(normalised_error_below(lse, want_lse, 1e-3));

  DeviceBuffer<bf16> d_out_rounded(to_bf16(out_rounded));
  flash_attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out_rounded.get(), d_lse.get(), x.B, x.T, x.H,
                           x.KV, x.D, nullptr, device_slopes);
  const auto dqkv = to_float(d_dqkv.download());
  EXPECT_TRUE(normalised_error_below(dqkv, want_dqkv, 2e-2));

  // deterministic: the same bits again (no atomics)
  flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), x.B, x.T, x.H, x.KV, x.D, nullptr, device_slopes);
  flash_attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out_rounded.get(), d_lse.get(), x.B, x.T, x.H,
                           x.KV, x.D, nullptr, device_slopes);
  EXPECT_TRUE(same_bits(to_float(d_out.download()), out));
  EXPECT_TRUE(same_bits(to_float(d_dqkv.download()), dqkv));
}

TEST_P(CudaFlashAttention, AgreesWithTheUnfusedDevicePath) {
  TWIN_REQUIRE_GPU();
  const FlashCase x = GetParam();
  const auto qkv = bf16_rounded(random_vector(x.qkv(), 63, -1.5f, 1.5f));
  const auto dout = bf16_rounded(random_vector(x.out(), 64));
  const std::vector<float> slopes = cpu::alibi_slopes(x.H);
  DeviceBuffer<bf16> d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout));
  DeviceBuffer<bf16> fused_out(x.out()), plain_out(x.out()), fused_dqkv(x.qkv()), plain_dqkv(x.qkv());
  DeviceBuffer<float> fused_lse(x.lse()), plain_lse(x.lse()), d_slopes(slopes);
  const float* device_slopes = x.alibi ? d_slopes.get() : nullptr;
  Cublas blas;
  flash_attention_forward(fused_out.get(), fused_lse.get(), d_qkv.get(), x.B, x.T, x.H, x.KV, x.D, nullptr,
                          device_slopes);
  attention_forward_gqa(plain_out.get(), plain_lse.get(), d_qkv.get(), x.B, x.T, x.H, x.KV, x.D, blas, nullptr,
                        device_slopes);
  flash_attention_backward(fused_dqkv.get(), d_dout.get(), d_qkv.get(), fused_out.get(), fused_lse.get(), x.B, x.T, x.H,
                           x.KV, x.D, nullptr, device_slopes);
  attention_backward_gqa(plain_dqkv.get(), d_dout.get(), d_qkv.get(), plain_lse.get(), x.B, x.T, x.H, x.KV, x.D, blas,
                         nullptr, device_slopes);
  EXPECT_TRUE(normalised_error_below(to_float(fused_out.download()), to_float(plain_out.download()), 1e-2));
  EXPECT_TRUE(normalised_error_below(fused_lse.download(), plain_lse.download(), 1e-3));
  EXPECT_TRUE(normalised_error_below(to_float(fused_dqkv.download()), to_float(plain_dqkv.download()), 3e-2));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashAttention,
                         ::testing::Values(FlashCase{2, 100, 4, 4, 64, false},   // multi-head, a partial tile
                                           FlashCase{1, 150, 8, 2, 128, false},  // grouped-query, 32-row dk/dv steps
                                           FlashCase{2, 70, 4, 1, 32, false},    // multi-query, gpt-tiny's head
                                           FlashCase{1, 129, 6, 3, 96, false},   // a last tile of one query
                                           FlashCase{1, 17, 2, 2, 64, false},    // less than a tile
                                           FlashCase{2, 96, 4, 2, 64, true},     // ALiBi
                                           FlashCase{1, 256, 2, 2, 128, true}));

}  // namespace
}  // namespace twin::kernels::cuda

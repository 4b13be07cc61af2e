// What the CUDA kernels share with the host, checked on any machine (no GPU needed): bf16 rounding (the host path of
// cuda_bf16.h against the CPU twin's), the scalar formulas of math.hpp against kernels/cpu, launch configurations,
// the error messages of the check macros, and host preconditions that throw before any launch.
#include <cuda_bf16.h>
#include <gtest/gtest.h>
#ifdef TWIN_HAVE_NCCL
#include <nccl.h>
#endif

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/cast.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda {
namespace {

using cpu::testing::random_vector;

std::uint16_t bits_of(__nv_bfloat16 x) {
  return static_cast<__nv_bfloat16_raw>(x).x;
}

// cuda_bf16.h's host path of __float2bfloat16_rn computes what cvt.rn.bf16.f32 computes on the device: if it agrees
// with cpu::float_to_bf16 on every upper half and the critical lower halves (ties, just below and above), the device's
// bf16 storage and the CPU twin's emulation (round_to_bf16) round identically.
TEST(CudaBf16, HostRoundingEqualsCpuTwinOnEveryExponentAndTie) {
  const std::uint32_t lower_halves[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1234u, 0xc000u};
  for (std::uint32_t upper = 0; upper <= 0xffffu; ++upper) {
    for (std::uint32_t lower : lower_halves) {
      const float x = std::bit_cast<float>((upper << 16) | lower);
      const std::uint16_t want = cpu::float_to_bf16(x);
      const std::uint16_t got = bits_of(__float2bfloat16_rn(x));
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(cpu::bf16_to_float(got))) << std::hex << upper << lower;
      } else {
        ASSERT_EQ(got, want) << "x bits " << std::hex << ((upper << 16) | lower);
      }
    }
  }
}

TEST(CudaBf16, HostWideningIsExact) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<std::uint16_t>(b);
    const float got = __bfloat162float(__nv_bfloat16(raw));
    const float want = cpu::bf16_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << std::hex << b;
    }
  }
}

TEST(CudaMath, GeluFormulasAreTheCpuTwins) {
  const auto x = random_vector(4096, 1, -8.0f, 8.0f);
  const auto dout = random_vector(4096, 2);
  std::vector<float> want(x.size()), want_dinp(x.size());
  cpu::gelu_forward(want.data(), x.data(), x.size());
  cpu::gelu_backward(want_dinp.data(), x.data(), dout.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(math::gelu(x[i]), want[i]) << "x = " << x[i];  // same operations, same bits on the host
    ASSERT_EQ(math::gelu_grad(x[i]) * dout[i], want_dinp[i]) << "x = " << x[i];
  }
}

// The SwiGLU's sigmoid, product and derivatives (math.hpp) against kernels/cpu/swiglu.cpp, bit for bit, over gates of
// every size: moderate ones, then the ends where the sigmoid saturates or exp_cephes flushes to 0 (below -87).
TEST(CudaMath, SwigluFormulasAreTheCpuTwins) {
  const int rows = 2, width = 4096;
  auto gate = random_vector(static_cast<std::size_t>(rows) * width, 3, -12.0f, 12.0f);
  const float extremes[] = {0.0f,   -0.0f, 1e-30f, -1e-30f, 80.0f,   -80.0f, 86.9f, -86.9f, 87.5f,
                            -87.5f, 88.0f, -88.0f, 100.0f,  -100.0f, 1e4f,   -1e4f, 3e38f,  -3e38f};
  for (std::size_t i = 0; i < std::size(extremes); ++i) gate[i] = extremes[i];
  const auto up = random_vector(gate.size(), 4, -3.0f, 3.0f);
  const auto dout = random_vector(gate.size(), 5);
  std::vector<float> inp(2 * gate.size());  // rows of [gate | up]
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      inp[static_cast<std::size_t>(r) * 2 * width + c] = gate[static_cast<std::size_t>(r) * width + c];
      inp[static_cast<std::size_t>(r) * 2 * width + width + c] = up[static_cast<std::size_t>(r) * width + c];
    }
  }
  std::vector<float> want(gate.size()), want_dinp(inp.size());
  cpu::swiglu_forward(want.data(), inp.data(), rows, width);
  cpu::swiglu_backward(want_dinp.data(), inp.data(), dout.data(), rows, width);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * width + c, row = static_cast<std::size_t>(r) * 2 * width;
      const float g = gate[i], u = up[i], dy = dout[i];
      // same operations, same bits on the host
      ASSERT_EQ(std::bit_cast<std::uint32_t>(math::swiglu(g, u)), std::bit_cast<std::uint32_t>(want[i])) << "g " << g;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(math::swiglu_dgate(g, u, dy)),
                std::bit_cast<std::uint32_t>(want_dinp[row + c]))
          << "g " << g;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(math::swiglu_dup(g, dy)),
                std::bit_cast<std::uint32_t>(want_dinp[row + width + c]))
          << "g " << g;
    }
  }
  for (float g : extremes) {  // finite at every finite gate, as the CPU twin promises
    ASSERT_TRUE(std::isfinite(math::swiglu_sigmoid(g))) << g;
    ASSERT_TRUE(std::isfinite(math::swiglu_dgate(g, 1.0f, 1.0f))) << g;
  }
}

// The rotary embeddings' cos / sin and rotation (math.hpp), applied on the host with the device kernel's indexing
// (pair i of head h of token (b, t)), against kernels/cpu/rope.cpp, forward and backward, bit for bit; rotating the
// whole head and, as GPT-NeoX's rotary_pct = 0.25, its first quarter.
TEST(CudaMath, RopeAnglesAndRotationAreTheCpuTwins) {
  const int B = 2, T = 300, H = 4, KV = 2, D = 64;
  const std::size_t row = static_cast<std::size_t>(H + 2 * KV) * D;
  const auto qkv = random_vector(static_cast<std::size_t>(B) * T * row, 6, -2.0f, 2.0f);
  for (const int rotary : {D, D / 4}) {
    for (const double direction : {1.0, -1.0}) {
      const int half = rotary / 2;
      auto want = qkv, got = qkv;
      if (direction > 0) {
        cpu::rope_forward(want.data(), B, T, H, KV, D, 10000.0f, rotary);
      } else {
        cpu::rope_backward(want.data(), B, T, H, KV, D, 10000.0f, rotary);
      }
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
          for (int h = 0; h < H + KV; ++h) {  // q's heads, then k's; v untouched
            float* x = got.data() + (static_cast<std::size_t>(b) * T + t) * row + static_cast<std::size_t>(h) * D;
            for (int i = 0; i < half; ++i) {
              float c = 0.0f, s = 0.0f;
              math::rope_cos_sin(t, i, rotary, 10000.0f, direction, &c, &s);
              math::rope_rotate(x[i], x[i + half], c, s);
            }
          }
        }
      }
      EXPECT_TRUE(cpu::testing::same_bits(got, want)) << "direction " << direction << ", rotary_dim " << rotary;
    }
  }
}

TEST(CudaMath, AdamWElementHasTheCpuTwinsBits) {
  const std::size_t n = 1000;
  auto param = random_vector(n, 2), m = random_vector(n, 3, 0.0f, 0.1f), v = random_vector(n, 4, 0.0f, 0.01f);
  const auto grad = random_vector(n, 5);
  auto param_cpu = param, m_cpu = m, v_cpu = v;
  for (int step = 1; step <= 3; ++step) {
    cpu::adamw_update(param_cpu.data(), grad.data(), m_cpu.data(), v_cpu.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      step, 0.5f);
    const math::AdamWConstants k = math::adamw_constants(3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
    for (std::size_t i = 0; i < n; ++i) math::adamw_element(param[i], grad[i], m[i], v[i], k);
  }
  EXPECT_TRUE(cpu::testing::same_bits(param, param_cpu));
  EXPECT_TRUE(cpu::testing::same_bits(m, m_cpu));
  EXPECT_TRUE(cpu::testing::same_bits(v, v_cpu));
}

TEST(CudaLaunch, GridStrideBlocksCoverAndClamp) {
  EXPECT_EQ(launch::grid_stride_blocks(1), 1u);
  EXPECT_EQ(launch::grid_stride_blocks(256), 1u);
  EXPECT_EQ(launch::grid_stride_blocks(257), 2u);
  EXPECT_EQ(launch::grid_stride_blocks(std::size_t{1} << 40), launch::kMaxGridStrideBlocks);
  EXPECT_EQ(launch::row_blocks(1), 1u);
  EXPECT_EQ(launch::row_blocks(8), 1u);
  EXPECT_EQ(launch::row_blocks(9), 2u);
}

TEST(CudaLaunch, ColumnSumShapeCoversEveryRowOnce) {
  for (int rows : {1, 63, 64, 65, 1000, 16384}) {
    for (int channels : {1, 31, 32, 33, 768}) {
      const launch::ColumnSumShape s = launch::column_sum_shape(rows, channels);
      EXPECT_GE(s.column_tiles * launch::kColumnTile, static_cast<unsigned>(channels));
      EXPECT_LT((s.column_tiles - 1) * launch::kColumnTile, static_cast<unsigned>(channels));
      // chunk c covers rows [64 c, 64 c + 64): each row in exactly one chunk, the last chunk not empty
      EXPECT_GE(s.chunks * launch::kRowsPerChunk, static_cast<unsigned>(rows));
      EXPECT_LT((s.chunks - 1) * launch::kRowsPerChunk, static_cast<unsigned>(rows));
      EXPECT_EQ(s.partial_floats(2), 2 * static_cast<std::size_t>(s.chunks) * channels);
    }
  }
  EXPECT_THROW(launch::column_sum_shape(0, 4), std::invalid_argument);
  EXPECT_THROW(launch::column_sum_shape(65536 * 64, 4), std::invalid_argument);  // past gridDim.y
  EXPECT_NO_THROW(launch::column_sum_shape(65535 * 64, 4));
}

TEST(CudaLaunch, EmbeddingBackwardShapeOwnsEveryVocabularyRowOnce) {
  const launch::EmbeddingBackwardShape s = launch::embedding_backward_shape(768, 50304);
  EXPECT_EQ(s.channel_tiles, 6u);  // 768 / 128
  EXPECT_EQ(s.vocab_ranges, 50u);  // ceil(50304 / 1024)
  EXPECT_EQ(launch::embedding_backward_shape(1, 1024).vocab_ranges, 1u);
  EXPECT_EQ(launch::embedding_backward_shape(1, 1025).vocab_ranges, 2u);
  EXPECT_THROW(launch::embedding_backward_shape(0, 10), std::invalid_argument);
}

TEST(CudaLaunch, NormRowsFitABlockOfRegistersOrTakeTheWarpPath) {
  EXPECT_EQ(launch::norm_threads(768), 32);                        // 96 packs of 8: 3 per thread
  EXPECT_EQ(launch::norm_threads(2048), 64);                       // 256 packs: 4 per thread
  EXPECT_EQ(launch::norm_threads(20480), 640);                     // MT-NLG's hidden size
  EXPECT_EQ(launch::norm_threads(32768), 1024);                    // the largest row a block holds
  for (int channels : {8, 64, 1024, 4096, 12288, 20480, 32768}) {  // every pack owned by a thread, at most 4 each
    const int threads = launch::norm_threads(channels);
    EXPECT_EQ(threads % 32, 0);
    EXPECT_GE(threads * launch::kNormPacks * 8, channels);
  }
  EXPECT_EQ(launch::norm_threads(100), 0);    // not a multiple of 8: one warp per row
  EXPECT_EQ(launch::norm_threads(32776), 0);  // too long for a block's registers
}

TEST(CudaLaunch, ReduceBlocksDependOnSizeAlone) {
  EXPECT_EQ(launch::reduce_blocks(1), 1u);
  EXPECT_EQ(launch::reduce_blocks(1024), 1u);
  EXPECT_EQ(launch::reduce_blocks(1025), 2u);
  EXPECT_EQ(launch::reduce_blocks(std::size_t{1} << 33), launch::kMaxReduceBlocks);
}

// The message names the library, the call as written, and file:line.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(CudaCheck, MacrosNameLibraryCallAndLine) {
  const std::string cuda = message_of([] { TWIN_CUDA_CHECK(cudaErrorMemoryAllocation); });
  EXPECT_NE(cuda.find("twin: CUDA error"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("cudaErrorMemoryAllocation"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("tests/kernels_cuda/host_test.cpp:"), std::string::npos) << cuda;
  const std::string cublas = message_of([] { TWIN_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED); });
  EXPECT_NE(cublas.find("twin: cuBLAS error"), std::string::npos) << cublas;
  EXPECT_NE(cublas.find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << cublas;
  EXPECT_NO_THROW(TWIN_CUDA_CHECK(cudaSuccess));
#ifdef TWIN_HAVE_NCCL
  const std::string nccl = message_of([] { TWIN_NCCL_CHECK(ncclInvalidArgument); });
  EXPECT_NE(nccl.find("twin: NCCL error"), std::string::npos) << nccl;
  EXPECT_NE(nccl.find("ncclInvalidArgument"), std::string::npos) << nccl;
  EXPECT_NO_THROW(TWIN_NCCL_CHECK(ncclSuccess));
#endif
}

// Preconditions are checked on the host before anything is launched: these throw on any machine.
TEST(CudaPreconditions, ThrowBeforeAnyLaunch) {
  const std::string message =
      message_of([] { layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr); });
  EXPECT_NE(message.find("twin::kernels::cuda::layernorm_forward: precondition failed: rows > 0"), std::string::npos)
      << message;
  EXPECT_NE(message.find("kernels/cuda/layernorm.cu:"), std::string::npos) << message;
  EXPECT_THROW(adamw_update(static_cast<float*>(nullptr), nullptr, nullptr, nullptr, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f,
                            0, 1.0f, nullptr),
               std::invalid_argument);  // step 0
  EXPECT_THROW(cross_entropy_combine(nullptr, nullptr, nullptr, 4, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(embedding_forward(nullptr, nullptr, nullptr, 4, 8, -1, 10, nullptr), std::invalid_argument);
  // n = 0 is a no-op, never a launch
  EXPECT_NO_THROW(fill(static_cast<float*>(nullptr), 0, 1.0f, nullptr));
  EXPECT_NO_THROW(gelu_forward(nullptr, nullptr, 0, nullptr));
}

}  // namespace
}  // namespace twin::kernels::cuda

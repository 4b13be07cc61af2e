// FP8 on the device against kernels/cpu/fp8 (skipped without a GPU): quantization bit for
// bit (plain, transposed, per-tensor and block-scaled quantize-dequantize, amaxes, scales), cuBLASLt's FP8 GEMM, and
// the FP8 linear layer of every recipe against the CPU's emulation, within bf16 tolerance. Inputs are bf16 values on
// both sides; the block-scaled recipes' dequantized values are exact in bf16, so only the GEMMs' sums differ.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "cuda_test_util.hpp"
#include "fp8_format_util.hpp"
#include "kernels/cpu/fp8.hpp"
#include "kernels/cpu/fp8_matmul.hpp"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/matmul.cuh"

namespace twin::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cpu::testing::random_vector;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::kBf16Tolerance;
using testing::normalised_error_below;
using testing::same_bits;
using testing::to_bf16;
using testing::to_float;

using testing::cpu_format;

int compute_capability() {
  int device = 0, major = 0, minor = 0;
  TWIN_CUDA_CHECK(cudaGetDevice(&device));
  TWIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TWIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return 10 * major + minor;
}

// bf16 values over a wide range (some past E4M3's 448 once scaled), with exact zeros and a few tiny ones
std::vector<float> wide_values(std::size_t n, unsigned seed) {
  auto x = random_vector(n, seed, -4.0f, 4.0f);
  for (std::size_t i = 0; i < n; i += 7) x[i] *= 100.0f;
  for (std::size_t i = 3; i < n; i += 11) x[i] *= 1e-4f;
  for (std::size_t i = 5; i < n; i += 97) x[i] = 0.0f;
  return bf16_rounded(x);
}

std::vector<float> read_floats(const float* device, std::size_t n) {
  std::vector<float> host(n);
  TWIN_CUDA_CHECK(cudaDeviceSynchronize());
  TWIN_CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

class CudaFp8Kernels : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(CudaFp8Kernels, QuantizeAndTransposeMatchCpuTwinBitForBit) {
  TWIN_REQUIRE_GPU();
  const Fp8Format format = GetParam();
  const int rows = 70, cols = 300;  // not multiples of the 32 x 32 transpose tile
  const auto x = wide_values(static_cast<std::size_t>(rows) * cols, 1);
  const float scale = 37.5f;
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_qdq(x.size());
  DeviceBuffer<float> d_scale(std::vector<float>{scale});
  DeviceBuffer<std::uint8_t> d_q(x.size()), d_qt(x.size());
  quantize_fp8(d_q.get(), d_x.get(), x.size(), d_scale.get(), format, nullptr);
  quantize_fp8_transposed(d_qt.get(), d_x.get(), rows, cols, d_scale.get(), format, nullptr);
  fp8_quantize_dequantize(d_qdq.get(), d_x.get(), x.size(), d_scale.get(), format, nullptr);
  const auto q = d_q.download(), qt = d_qt.download();
  std::vector<float> want_qdq(x.size());
  cpu::fp8_quantize_dequantize(want_qdq.data(), x.data(), x.size(), scale, cpu_format(format));
  int saturated = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * cols + c;
      const std::uint8_t want = cpu::float_to_fp8(x[i] * scale, cpu_format(format));
      ASSERT_EQ(q[i], want) << "element (" << r << ", " << c << ") = " << x[i];
      ASSERT_EQ(qt[static_cast<std::size_t>(c) * rows + r], want) << "transposed (" << c << ", " << r << ")";
      saturated += std::fabs(x[i] * scale) > cpu::fp8_max(cpu_format(format));
    }
  }
  if (format == Fp8Format::E4M3) {
    EXPECT_GT(saturated, 0) << "the case saturates some elements";
  }
  EXPECT_TRUE(same_bits(to_float(d_qdq.download()), bf16_rounded(want_qdq)));
}

TEST_P(CudaFp8Kernels, AmaxAndScalesMatchCpuTwin) {
  TWIN_REQUIRE_GPU();
  const Fp8Format format = GetParam();
  auto x = wide_values(100003, 2);
  DeviceBuffer<bf16> d_x(to_bf16(x));
  DeviceBuffer<float> d_amax(std::vector<float>{0.0f}), d_scales(4);
  absolute_max(d_amax.get(), d_x.get(), x.size(), nullptr);
  fp8_tensor_scale(d_scales.get(), d_scales.get() + 1, d_amax.get(), 0.0f, format, nullptr);
  fp8_tensor_scale(d_scales.get() + 2, d_scales.get() + 3, nullptr, 3.25f, format, nullptr);
  const float amax = cpu::absolute_max(x.data(), x.size());
  const float scale = cpu::fp8_scale_from_amax(amax, cpu::fp8_max(cpu_format(format)), 1.0f);
  EXPECT_EQ(d_amax.download()[0], amax);
  EXPECT_EQ(d_scales.download(), (std::vector<float>{scale, 1.0f / scale, 3.25f, 1.0f / 3.25f}));
  // a NaN wins the amax, and a NaN amax keeps the previous scale (1)
  x[4321] = std::numeric_limits<float>::quiet_NaN();
  d_x.upload(to_bf16(x));
  d_amax.upload({0.0f});
  absolute_max(d_amax.get(), d_x.get(), x.size(), nullptr);
  fp8_tensor_scale(d_scales.get(), d_scales.get() + 1, d_amax.get(), 0.0f, format, nullptr);
  EXPECT_TRUE(std::isnan(d_amax.download()[0]));
  EXPECT_EQ(d_scales.download()[0], 1.0f);
}

// Tiles (1 x 128), Blocks (128 x 128), Mx (1 x 32), along rows and down columns, against cpu::fp8_quantize_operand
TEST_P(CudaFp8Kernels, BlockScaledQuantizeDequantizeMatchesCpuTwinBitForBit) {
  TWIN_REQUIRE_GPU();
  const Fp8Format format = GetParam();
  const int rows = 200, cols = 300;  // partial tiles and blocks at both edges
  const auto x = wide_values(static_cast<std::size_t>(rows) * cols, 3);
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_out(x.size());
  for (bool along_columns : {false, true}) {
    for (cpu::Fp8Scaling scaling : {cpu::Fp8Scaling::Tiles, cpu::Fp8Scaling::Blocks, cpu::Fp8Scaling::Mx}) {
      d_out.poison();
      if (scaling == cpu::Fp8Scaling::Tiles) {
        fp8_quantize_dequantize_tiles(d_out.get(), d_x.get(), rows, cols, 128, along_columns, format, nullptr);
      } else if (scaling == cpu::Fp8Scaling::Blocks) {
        fp8_quantize_dequantize_blocks(d_out.get(), d_x.get(), rows, cols, 128, format, nullptr);
      } else {
        mxfp8_quantize_dequantize(d_out.get(), d_x.get(), rows, cols, along_columns, format, nullptr);
      }
      std::vector<float> want(x.size());
      cpu::fp8_quantize_operand(want.data(), x.data(), rows, cols, cpu::Fp8Operand{cpu_format(format), scaling, 1.0f},
                                along_columns);
      EXPECT_TRUE(same_bits(to_float(d_out.download()), want))
          << "scaling " << static_cast<int>(scaling) << " along columns " << along_columns
          << " (the dequantized values are exact in bf16)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaFp8Kernels, ::testing::Values(Fp8Format::E4M3, Fp8Format::E5M2),
                         [](const auto& test) { return test.param == Fp8Format::E4M3 ? "E4M3" : "E5M2"; });

// cuBLASLt's FP8 GEMM: from sm_89 on (FP8 tensor cores), D (m, n) = a_inv b_inv A^T B from quantized bytes against
// the dequantized product; below, try_fp8_gemm declines (false, nothing run) and the layers take the bf16 path
TEST(CudaFp8Gemm, RunsFromSm89AndMatchesTheDequantizedProduct) {
  TWIN_REQUIRE_GPU();
  const int m = 128, n = 96, k = 256;
  const auto a = wide_values(static_cast<std::size_t>(m) * k, 4), b = wide_values(static_cast<std::size_t>(n) * k, 5);
  const float a_scale = 2.0f, b_scale = 0.75f;
  DeviceBuffer<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_out(static_cast<std::size_t>(m) * n);
  DeviceBuffer<float> d_scales(std::vector<float>{a_scale, 1.0f / a_scale, b_scale, 1.0f / b_scale});
  DeviceBuffer<std::uint8_t> d_qa(a.size()), d_qb(b.size());
  quantize_fp8(d_qa.get(), d_a.get(), a.size(), d_scales.get(), Fp8Format::E4M3, nullptr);
  quantize_fp8(d_qb.get(), d_b.get(), b.size(), d_scales.get() + 2, Fp8Format::E5M2, nullptr);
  Cublas blas;
  Fp8GemmPlans plans;
  d_out.poison();
  const bool ran = try_fp8_gemm(blas, plans, m, n, k, Fp8Matrix{d_qa.get(), Fp8Format::E4M3, d_scales.get() + 1},
                                Fp8Matrix{d_qb.get(), Fp8Format::E5M2, d_scales.get() + 3}, d_out.get(), CUDA_R_16BF,
                                false, nullptr, nullptr);
  EXPECT_EQ(plans.problems(), 1u);
  if (compute_capability() < 89) {
    EXPECT_FALSE(ran) << "an FP8 algorithm below sm_89";
    GTEST_SKIP() << "sm_" << compute_capability() << ": no FP8 GEMM to compare below sm_89 (its refusal checked)";
  }
  ASSERT_TRUE(ran) << "cuBLASLt has no FP8 algorithm on this sm_" << compute_capability() << " GPU";
  std::vector<float> want(static_cast<std::size_t>(m) * n, 0.0f);  // column-major (m, n): A row-major (m, k)
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        sum += double(cpu::round_to_fp8(a[i * k + p] * a_scale, cpu::Fp8Format::E4M3)) *
               cpu::round_to_fp8(b[j * k + p] * b_scale, cpu::Fp8Format::E5M2);
      }
      want[static_cast<std::size_t>(j) * m + i] = static_cast<float>(sum / a_scale / b_scale);
    }
  }
  EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), want, kBf16Tolerance));
}

// --- the FP8 linear layer of each recipe against kernels/cpu/fp8_matmul ----------------------------------------------
struct Recipe {
  const char* name;
  cpu::Fp8Operand input, weight, gradient;
};
std::ostream& operator<<(std::ostream& out, const Recipe& r) {
  return out << r.name;
}
struct LayerShape {
  int rows, in_features, out_features;
};

Fp8Operand device_operand(const cpu::Fp8Operand& x) {
  return Fp8Operand{x.format == cpu::Fp8Format::E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2,
                    static_cast<Fp8Scaling>(static_cast<int>(x.scaling)), x.scale};
}

class CudaFp8Matmul : public ::testing::TestWithParam<Recipe> {};

TEST_P(CudaFp8Matmul, ForwardAndBackwardFollowCpuEmulation) {
  TWIN_REQUIRE_GPU();
  const Recipe& recipe = GetParam();
  // the tiny model's MLP (FP8 GEMM-sized on sm_90), and a shape no FP8 GEMM takes (the fallback everywhere)
  for (const LayerShape shape : {LayerShape{256, 128, 512}, LayerShape{50, 72, 40}}) {
    const auto [rows, in_f, out_f] = shape;
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " in " << in_f << " out " << out_f);
    const auto inp = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * in_f, 6));
    const auto weight = bf16_rounded(random_vector(static_cast<std::size_t>(out_f) * in_f, 7, -0.1f, 0.1f));
    const auto bias = bf16_rounded(random_vector(out_f, 8));
    const auto dout = bf16_rounded(random_vector(static_cast<std::size_t>(rows) * out_f, 9, -0.01f, 0.01f));
    const auto dweight0 = random_vector(weight.size(), 10), dbias0 = random_vector(out_f, 11);
    std::vector<float> out(static_cast<std::size_t>(rows) * out_f), dinp(inp.size());
    auto dweight = dweight0, dbias = dbias0;
    cpu::fp8_matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), rows, in_f, out_f, recipe.input,
                            recipe.weight);
    cpu::fp8_matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), rows,
                             in_f, out_f, recipe.input, recipe.weight, recipe.gradient);

    Cublas blas;
    Fp8GemmPlans plans;
    DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_weight(to_bf16(weight)), d_bias(to_bf16(bias)), d_dout(to_bf16(dout));
    DeviceBuffer<bf16> d_out(out.size()), d_dinp(dinp.size());
    DeviceBuffer<float> d_dweight(dweight0), d_dbias(dbias0), d_amaxes(3);
    d_out.poison(), d_dinp.poison();
    fp8_matmul_forward(d_out.get(), d_inp.get(), d_weight.get(), d_bias.get(), rows, in_f, out_f,
                       device_operand(recipe.input), device_operand(recipe.weight), d_amaxes.get(), blas, plans,
                       nullptr);
    fp8_matmul_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(), d_weight.get(), rows,
                        in_f, out_f, device_operand(recipe.input), device_operand(recipe.weight),
                        device_operand(recipe.gradient), d_amaxes.get() + 2, blas, plans, nullptr);
    EXPECT_TRUE(normalised_error_below(to_float(d_out.download()), out, kBf16Tolerance)) << "out";
    EXPECT_TRUE(normalised_error_below(to_float(d_dinp.download()), dinp, kBf16Tolerance)) << "dinp";
    EXPECT_TRUE(normalised_error_below(d_dweight.download(), dweight, kBf16Tolerance)) << "dweight";
    EXPECT_TRUE(normalised_error_below(d_dbias.download(), dbias, 1e-5)) << "dbias";
    const std::vector<float> amaxes = read_floats(d_amaxes.get(), 3);
    EXPECT_EQ(amaxes[0], cpu::absolute_max(inp.data(), inp.size()));
    EXPECT_EQ(amaxes[1], cpu::absolute_max(weight.data(), weight.size()));
    EXPECT_EQ(amaxes[2], cpu::absolute_max(dout.data(), dout.size()));
  }
}

constexpr auto E4M3 = cpu::Fp8Format::E4M3;
constexpr auto E5M2 = cpu::Fp8Format::E5M2;
INSTANTIATE_TEST_SUITE_P(Recipes, CudaFp8Matmul,
                         ::testing::Values(Recipe{"delayed_hybrid",
                                                  {E4M3, cpu::Fp8Scaling::PerTensor, 100.0f},
                                                  {E4M3, cpu::Fp8Scaling::PerTensor, 3000.0f},
                                                  {E5M2, cpu::Fp8Scaling::PerTensor, 4.0e6f}},
                                           Recipe{"tensorwise_hybrid",
                                                  {E4M3, cpu::Fp8Scaling::Current},
                                                  {E4M3, cpu::Fp8Scaling::Current},
                                                  {E5M2, cpu::Fp8Scaling::Current}},
                                           Recipe{"tensorwise_e4m3",
                                                  {E4M3, cpu::Fp8Scaling::Current},
                                                  {E4M3, cpu::Fp8Scaling::Current},
                                                  {E4M3, cpu::Fp8Scaling::Current}},
                                           Recipe{"blockwise",
                                                  {E4M3, cpu::Fp8Scaling::Tiles},
                                                  {E4M3, cpu::Fp8Scaling::Blocks},
                                                  {E4M3, cpu::Fp8Scaling::Tiles}},
                                           Recipe{"mxfp8",
                                                  {E4M3, cpu::Fp8Scaling::Mx},
                                                  {E4M3, cpu::Fp8Scaling::Mx},
                                                  {E5M2, cpu::Fp8Scaling::Mx}}),
                         [](const auto& test) { return std::string(test.param.name); });

}  // namespace
}  // namespace twin::kernels::cuda

// The FP8 formulas the CUDA kernels run (kernels/cuda/fp8_math.hpp), checked on the CPU bit for bit against
// kernels/cpu/fp8 over every FP8 code, ~1M fp32 bit patterns spread over the whole range, and the hard cases: ties
// between neighbouring FP8 values, subnormals, the saturation boundary, infinities and NaNs. Also cuda_fp8.h's host
// conversion (what __nv_fp8_e4m3 / __nv_fp8_e5m2 store) against the same twin. No GPU needed.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "fp8_format_util.hpp"
#include "kernels/cpu/fp8.hpp"
#include "kernels/cuda/fp8_math.hpp"

namespace twin::kernels::cuda {
namespace {

using fp8::Fp8Format;

using testing::cpu_format;

// the same float, or both NaN
bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// Inputs that probe every branch: a stride through all fp32 bit patterns, and around every FP8 value (the value, the
// midpoints to its neighbours, one fp32 ulp either side of each), in both signs, and the specials.
std::vector<float> probe_values(Fp8Format format) {
  std::vector<float> values;
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099)
    values.push_back(std::bit_cast<float>(std::uint32_t(bits)));
  const cpu::Fp8Format f = cpu_format(format);
  for (int code = 0; code < 0x7f; ++code) {
    const float v = cpu::fp8_to_float(static_cast<std::uint8_t>(code), f);
    const float next = cpu::fp8_to_float(static_cast<std::uint8_t>(code + 1), f);
    if (!std::isfinite(v)) continue;
    const float mid = std::isfinite(next) && !std::isnan(next)
                          ? (v + next) / 2
                          : v + (v - cpu::fp8_to_float(static_cast<std::uint8_t>(code - 1), f)) / 2;
    for (float x : {v, mid}) {
      for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, std::numeric_limits<float>::infinity())}) {
        values.push_back(y);
        values.push_back(-y);
      }
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x :
       {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
        448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f, std::ldexp(1.0f, -10), std::ldexp(1.0f, -17),
        std::ldexp(1.5f, -10), std::ldexp(1.5f, -17)}) {
    values.push_back(x);
  }
  return values;
}

class CudaFp8Math : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(CudaFp8Math, RoundingAndBitsMatchCpuTwinBitForBit) {
  const Fp8Format format = GetParam();
  const cpu::Fp8Format f = cpu_format(format);
  EXPECT_EQ(fp8::fp8_max(format), cpu::fp8_max(f));
  int checked = 0;
  for (float x : probe_values(format)) {
    ASSERT_EQ(fp8::float_to_fp8(x, format), cpu::float_to_fp8(x, f))
        << "x = " << x << " (bits " << std::hex << std::bit_cast<std::uint32_t>(x) << ")";
    ASSERT_TRUE(same_value(fp8::round_to_fp8(x, format), cpu::round_to_fp8(x, f))) << "x = " << x;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST_P(CudaFp8Math, EveryCodeReadsBackAsCpuTwin) {
  const Fp8Format format = GetParam();
  for (int code = 0; code < 256; ++code) {
    const auto bits = static_cast<std::uint8_t>(code);
    ASSERT_TRUE(same_value(fp8::fp8_to_float(bits, format), cpu::fp8_to_float(bits, cpu_format(format))))
        << "code " << code;
  }
}

// cuda_fp8.h's conversion with __NV_SATFINITE (the host path of what the device's cvt computes) rounds as the twin
TEST_P(CudaFp8Math, CudaFp8HeaderConvertsAsCpuTwin) {
  const Fp8Format format = GetParam();
  const __nv_fp8_interpretation_t kind = format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  for (float x : probe_values(format)) {
    const auto cuda = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind));
    const std::uint8_t twin = cpu::float_to_fp8(x, cpu_format(format));
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(cpu::fp8_to_float(cuda, cpu_format(format)))) << "NaN stays NaN";
    } else {
      ASSERT_EQ(cuda, twin) << "x = " << x;
    }
  }
}

TEST_P(CudaFp8Math, ScalesMatchCpuTwin) {
  const Fp8Format format = GetParam();
  const float max = fp8::fp8_max(format);
  std::vector<float> amaxes = {0.0f,
                               -1.0f,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               1e-38f,
                               std::numeric_limits<float>::max(),
                               max};
  for (float a : cpu::testing::random_vector(2000, 7, -40.0f, 40.0f)) amaxes.push_back(std::exp2(a) * 1.37f);
  for (float amax : amaxes) {
    for (int margin : {0, 1, 3}) {
      for (bool power_of_two : {false, true}) {
        ASSERT_TRUE(same_value(fp8::scale_from_amax(amax, max, 0.5f, margin, power_of_two),
                               cpu::fp8_scale_from_amax(amax, max, 0.5f, margin, power_of_two)))
            << "amax " << amax << " margin " << margin << " power_of_two " << power_of_two;
      }
    }
  }
}

TEST_P(CudaFp8Math, QuantizeDequantizeMatchesCpuTwin) {
  const Fp8Format format = GetParam();
  const auto x = cpu::testing::random_vector(4096, 11, -3.0f, 3.0f);
  for (float scale : {1.0f, 0.37f, 149.3f, 1e-3f, 4096.0f}) {
    std::vector<float> want(x.size());
    cpu::fp8_quantize_dequantize(want.data(), x.data(), x.size(), scale, cpu_format(format));
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(same_value(fp8::quantize_dequantize(x[i], scale, format), want[i])) << x[i] << " scale " << scale;
    }
  }
}

TEST_P(CudaFp8Math, MxScalesMatchCpuTwin) {
  const Fp8Format format = GetParam();
  const cpu::Fp8Format f = cpu_format(format);
  std::vector<float> amaxes = {0.0f,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max()};
  for (int e = -150; e <= 127; ++e) {  // at powers of two of fp8_max exactly and either side
    const float at = std::ldexp(fp8::fp8_max(format), e);
    if (at > 0 && std::isfinite(at)) {
      for (float x : {at, std::nextafter(at, 0.0f), std::nextafter(at, std::numeric_limits<float>::infinity())}) {
        amaxes.push_back(x);
      }
    }
  }
  for (float a : cpu::testing::random_vector(2000, 13, -140.0f, 120.0f)) amaxes.push_back(std::exp2(a));
  for (float amax : amaxes) {
    for (auto [rule, cpu_rule] : {std::pair{fp8::MxScaleRule::TransformerEngine, cpu::MxScaleRule::TransformerEngine},
                                  std::pair{fp8::MxScaleRule::Ocp, cpu::MxScaleRule::Ocp}}) {
      ASSERT_EQ(fp8::mx_scale_bits(amax, format, rule), cpu::mx_scale_bits(amax, f, cpu_rule)) << "amax " << amax;
    }
  }
  for (int bits = 0; bits < 256; ++bits) {
    ASSERT_TRUE(same_value(fp8::e8m0_to_float(static_cast<std::uint8_t>(bits)),
                           cpu::e8m0_to_float(static_cast<std::uint8_t>(bits))))
        << "E8M0 " << bits;
  }
  // one MX block of a row read back as the twin reads it
  auto x = cpu::testing::random_vector(fp8::kMxBlock, 17, -5.0f, 5.0f);
  x[3] = 1e-6f, x[9] = 0.0f;
  std::vector<float> want(x.size());
  cpu::mxfp8_quantize_dequantize(want.data(), x.data(), 1, fp8::kMxBlock, f);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float scale = fp8::e8m0_to_float(fp8::mx_scale_bits(amax, format));
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(same_value(fp8::mx_quantize_dequantize(x[i], scale, format), want[i])) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaFp8Math, ::testing::Values(Fp8Format::E4M3, Fp8Format::E5M2),
                         [](const auto& test) { return test.param == Fp8Format::E4M3 ? "E4M3" : "E5M2"; });

}  // namespace
}  // namespace twin::kernels::cuda

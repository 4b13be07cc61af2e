// FP8 numerics against the OCP FP8 and MX specifications and hand-computed values: bit patterns, round to nearest
// even, saturation, an exhaustive round trip, and each scaling recipe of Transformer Engine.
#include "kernels/cpu/fp8.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace twin::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr Fp8Format E4M3 = Fp8Format::E4M3;
constexpr Fp8Format E5M2 = Fp8Format::E5M2;

// OFP8 rev 1.0, Table 1: the encodings of each format's landmarks.
TEST(CpuFp8, SpecialValuesOfTheOcpSpecification) {
  EXPECT_EQ(fp8_to_float(0x7e, E4M3), 448.0f);                         // max normal S.1111.110
  EXPECT_EQ(fp8_to_float(0x08, E4M3), std::ldexp(1.0f, -6));           // min normal S.0001.000
  EXPECT_EQ(fp8_to_float(0x07, E4M3), 0.875f * std::ldexp(1.0f, -6));  // max subnormal S.0000.111
  EXPECT_EQ(fp8_to_float(0x01, E4M3), std::ldexp(1.0f, -9));           // min subnormal S.0000.001
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7f, E4M3)));                   // S.1111.111
  EXPECT_TRUE(std::isnan(fp8_to_float(0xff, E4M3)));
  EXPECT_EQ(fp8_to_float(0x78, E4M3), 256.0f);                         // S.1111.000 is a normal number in E4M3
  EXPECT_EQ(fp8_to_float(0x7b, E5M2), 57344.0f);                       // max normal S.11110.11
  EXPECT_EQ(fp8_to_float(0x04, E5M2), std::ldexp(1.0f, -14));          // min normal
  EXPECT_EQ(fp8_to_float(0x03, E5M2), 0.75f * std::ldexp(1.0f, -14));  // max subnormal
  EXPECT_EQ(fp8_to_float(0x01, E5M2), std::ldexp(1.0f, -16));          // min subnormal
  EXPECT_EQ(fp8_to_float(0x7c, E5M2), kInf);
  EXPECT_EQ(fp8_to_float(0xfc, E5M2), -kInf);
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7d, E5M2)));
  EXPECT_EQ(fp8_max(E4M3), 448.0f);
  EXPECT_EQ(fp8_max(E5M2), 57344.0f);
  EXPECT_TRUE(std::signbit(fp8_to_float(0x80, E4M3)));  // -0
}

TEST(CpuFp8, RoundsToNearestEven) {
  EXPECT_EQ(float_to_fp8(1.0f, E4M3), 0x38);  // 0.0111.000
  EXPECT_EQ(float_to_fp8(-1.0f, E4M3), 0xb8);
  EXPECT_EQ(float_to_fp8(1.0625f, E4M3), 0x38);      // tie between 1 (even) and 1.125: down
  EXPECT_EQ(float_to_fp8(1.1875f, E4M3), 0x3a);      // tie between 1.125 (odd) and 1.25: up
  EXPECT_EQ(float_to_fp8(1.07f, E4M3), 0x39);        // past the tie: up
  EXPECT_EQ(float_to_fp8(1.9f, E4M3), 0x3f);         // 1.875
  EXPECT_EQ(float_to_fp8(1.97f, E4M3), 0x40);        // carries into the next binade: 2.0
  EXPECT_EQ(float_to_fp8(1.0f, E5M2), 0x3c);         // 0.01111.00
  EXPECT_EQ(float_to_fp8(1.125f, E5M2), 0x3c);       // tie between 1 and 1.25: even, down
  EXPECT_EQ(float_to_fp8(1.375f, E5M2), 0x3e);       // tie between 1.25 and 1.5: even, up
  EXPECT_EQ(float_to_fp8(3.14159265f, E4M3), 0x45);  // pi -> 3.25 (grid 0.25 in [2, 4)): 0.1000.101
}

TEST(CpuFp8, SubnormalsAndUnderflow) {
  const float tiny = std::ldexp(1.0f, -9);  // E4M3's smallest subnormal
  EXPECT_EQ(float_to_fp8(tiny, E4M3), 0x01);
  EXPECT_EQ(float_to_fp8(tiny / 2, E4M3), 0x00);      // exactly half: ties to even, zero
  EXPECT_EQ(float_to_fp8(-tiny / 2, E4M3), 0x80);     // a negative zero
  EXPECT_EQ(float_to_fp8(tiny * 0.51f, E4M3), 0x01);  // past half: the smallest subnormal
  EXPECT_EQ(float_to_fp8(tiny * 1.5f, E4M3), 0x02);   // tie between 1 (odd) and 2 units: up
  EXPECT_EQ(float_to_fp8(tiny * 2.5f, E4M3), 0x02);   // tie between 2 (even) and 3 units: down
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -16), E5M2), 0x01);
  EXPECT_EQ(float_to_fp8(std::ldexp(1.0f, -17), E5M2), 0x00);
}

TEST(CpuFp8, SaturatesAsTransformerEngineCasts) {
  EXPECT_EQ(float_to_fp8(460.0f, E4M3), 0x7e);  // below 448 + half an ulp (464): rounds to 448
  EXPECT_EQ(float_to_fp8(464.0f, E4M3), 0x7e);  // at it: saturates (no 480 in E4M3)
  EXPECT_EQ(float_to_fp8(1e6f, E4M3), 0x7e);
  EXPECT_EQ(float_to_fp8(-1e6f, E4M3), 0xfe);
  EXPECT_EQ(float_to_fp8(kInf, E4M3), 0x7e);  // __NV_SATFINITE: infinities too
  EXPECT_EQ(float_to_fp8(-kInf, E4M3), 0xfe);
  EXPECT_EQ(float_to_fp8(kInf, E5M2), 0x7b);  // not E5M2's infinity
  EXPECT_EQ(float_to_fp8(61439.0f, E5M2), 0x7b);
  EXPECT_EQ(float_to_fp8(1e9f, E5M2), 0x7b);
  EXPECT_EQ(float_to_fp8(std::numeric_limits<float>::quiet_NaN(), E4M3), 0x7f);
  EXPECT_EQ(float_to_fp8(std::numeric_limits<float>::quiet_NaN(), E5M2), 0x7e);
  EXPECT_TRUE(std::isnan(round_to_fp8(std::numeric_limits<float>::quiet_NaN(), E4M3)));
}

// Every code decodes to a value that encodes back to it (NaNs to the canonical NaN), and rounding the value directly
// agrees with the bits on a sweep of fp32 patterns.
TEST(CpuFp8, ExhaustiveRoundTripAndValueRoundingAgree) {
  for (Fp8Format format : {E4M3, E5M2}) {
    for (int code = 0; code < 256; ++code) {
      const auto bits = static_cast<std::uint8_t>(code);
      const float value = fp8_to_float(bits, format);
      if (std::isnan(value)) continue;
      if (std::isinf(value)) {
        EXPECT_EQ(float_to_fp8(value, format), std::signbit(value) ? 0xfb : 0x7b);  // saturated
        continue;
      }
      EXPECT_EQ(float_to_fp8(value, format), bits) << "code " << code;
      EXPECT_EQ(round_to_fp8(value, format), value);
    }
    for (std::uint32_t pattern = 0; pattern < 0xff800000u; pattern += 0x00012345u) {
      const float x = std::bit_cast<float>(pattern);
      if (std::isnan(x)) continue;
      const float via_bits = fp8_to_float(float_to_fp8(x, format), format);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to_fp8(x, format)), std::bit_cast<std::uint32_t>(via_bits))
          << "x = " << x;
    }
  }
}

// Round to nearest, ties to even, against the code table itself (fp8_to_float decodes the bits, independent of the
// rounding): between each two neighbouring codes, the midpoint goes to the one with the even code, the fp32 values on
// either side of it to the nearer code, and a scaled tensor rounds alike (fp8_quantize_dequantize's loop).
TEST(CpuFp8, RoundsToTheNearestCodeTiesToEvenBetweenEveryTwoNeighbours) {
  for (Fp8Format format : {E4M3, E5M2}) {
    const int largest = format == E4M3 ? 0x7e : 0x7b;  // the largest finite code
    for (int code = 0; code < largest; ++code) {
      const float lo = fp8_to_float(static_cast<std::uint8_t>(code), format);
      const float hi = fp8_to_float(static_cast<std::uint8_t>(code + 1), format);
      const float mid = lo + (hi - lo) / 2;  // exact: both are short binary fractions
      const float even = code % 2 == 0 ? lo : hi;
      EXPECT_EQ(round_to_fp8(mid, format), even) << "between codes " << code << " and " << code + 1;
      EXPECT_EQ(round_to_fp8(-mid, format), -even);
      EXPECT_EQ(round_to_fp8(std::nextafter(mid, 0.0f), format), lo) << "code " << code;
      EXPECT_EQ(round_to_fp8(std::nextafter(mid, kInf), format), hi) << "code " << code + 1;
      const float x[3] = {std::nextafter(mid, 0.0f) * 4, mid * 4, std::nextafter(mid, kInf) * 4};
      float y[3];
      fp8_quantize_dequantize(y, x, 3, 0.25f, format);
      EXPECT_EQ(y[0], lo * 4);
      EXPECT_EQ(y[1], even * 4);
      EXPECT_EQ(y[2], hi * 4);
    }
    // fp32 subnormals, far below the smallest FP8 subnormal: zeros of their sign
    EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to_fp8(std::numeric_limits<float>::denorm_min(), format)), 0u);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(round_to_fp8(-std::numeric_limits<float>::denorm_min(), format)),
              0x80000000u);
  }
}

TEST(CpuFp8, ScaleFromAmaxAsTransformerEngine) {
  EXPECT_EQ(fp8_scale_from_amax(2.0f, 448.0f, 1.0f), 224.0f);
  EXPECT_EQ(fp8_scale_from_amax(2.0f, 448.0f, 1.0f, 1), 112.0f);  // margin 1: half
  EXPECT_EQ(fp8_scale_from_amax(0.0f, 448.0f, 5.0f), 5.0f);       // nothing seen: keep
  EXPECT_EQ(fp8_scale_from_amax(kInf, 448.0f, 5.0f), 5.0f);
  EXPECT_EQ(fp8_scale_from_amax(std::numeric_limits<float>::quiet_NaN(), 448.0f, 5.0f), 5.0f);
  EXPECT_EQ(fp8_scale_from_amax(1e-40f, 448.0f, 1.0f), std::numeric_limits<float>::max());  // past fp32
  EXPECT_EQ(fp8_scale_from_amax(3.0f, 448.0f, 1.0f, 0, true), 128.0f);  // 149.3 down to a power of two
  std::vector<float> x{3.0f, -0.3f, 0.01f, 2.9f};
  std::vector<float> y(x.size());
  fp8_quantize_dequantize(y.data(), x.data(), x.size(), 128.0f, E4M3);
  EXPECT_EQ(y[0], 3.0f);         // 384 is on the grid
  EXPECT_EQ(y[1], -0.3125f);     // 38.4 -> 40 (grid 4 in [32, 64))
  EXPECT_EQ(y[2], 1.25f / 128);  // 1.28 -> 1.25 (grid 1/8 in [1, 2))
  EXPECT_EQ(y[3], 3.0f);         // 371.2 -> 384 (grid 32 in [256, 512))
}

TEST(CpuFp8, DelayedScalingUsesTheWindowOfEarlierSteps) {
  DelayedScaling delayed(3);
  EXPECT_EQ(delayed.scale(), 1.0f);  // nothing recorded yet
  const float steps[] = {1.0f, 4.0f, 2.0f, 0.5f, 0.5f};
  const float expected[] = {448.0f, 112.0f, 112.0f, 112.0f, 224.0f};  // window of 3: 4 drops out at step 5
  for (int i = 0; i < 5; ++i) {
    delayed.record(steps[i]);
    delayed.record(steps[i] / 2);  // a smaller amax of the same step changes nothing
    delayed.update(448.0f);
    EXPECT_EQ(delayed.scale(), expected[i]) << "step " << i;
  }
  DelayedScaling recent(3, /*use_max=*/false);
  recent.record(4.0f);
  recent.update(448.0f);
  recent.record(0.5f);
  recent.update(448.0f);
  EXPECT_EQ(recent.scale(), 896.0f);  // the most recent amax only
  DelayedScaling idle(3);
  idle.record(2.0f);
  idle.update(448.0f);
  idle.update(448.0f);  // a step that saw nothing: the window's max still 2
  EXPECT_EQ(idle.scale(), 224.0f);
}

TEST(CpuFp8, BlockwiseScalesEachTileAndBlockApart) {
  // Two rows of 256: tile (row 0, columns 0..127) has amax 3 (scale 128), tile (row 0, 128..255) amax 0.02
  // (448 / 0.02 = 22400 -> 16384), row 1 is zeros.
  std::vector<float> x(2 * 256, 0.0f), y(x.size());
  x[0] = 3.0f;
  x[1] = -0.3f;
  x[128] = 0.02f;
  x[129] = 0.0123f;
  fp8_quantize_dequantize_row_tiles(y.data(), x.data(), 2, 256, 128, E4M3);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], -0.3125f);
  EXPECT_EQ(y[128], 320.0f / 16384);  // 327.68 -> 320 (grid 32 in [256, 512))
  EXPECT_EQ(y[129], 208.0f / 16384);  // 201.5232 -> 208 (grid 16 in [128, 256))
  for (int i = 256; i < 512; ++i) EXPECT_EQ(y[i], 0.0f);
  // The same data in one 2D block of 2 x 256 shares the first tile's scale: 0.0123 * 128 = 1.574 -> 1.625.
  std::vector<float> z(x.size());
  fp8_quantize_dequantize_blocks(z.data(), x.data(), 2, 256, 256, E4M3);
  EXPECT_EQ(z[129], 1.625f / 128);
  // Float32 scales (not powers of two): amax lands on 448 exactly.
  fp8_quantize_dequantize_row_tiles(y.data(), x.data(), 2, 256, 128, E4M3, /*power_of_two=*/false);
  EXPECT_FLOAT_EQ(y[0], 3.0f);
  EXPECT_FLOAT_EQ(y[128], 0.02f);
}

TEST(CpuFp8, A128By128BlockTakesItsScaleFromEveryRow) {
  // A 130 x 130 weight in 128 x 128 blocks: block (0, 0) holds small values in its first row and its amax, 100, in
  // its last row (127), so its scale is 448 / 100 -> 4 (a power of two). A scale from the first row alone (amax 0.3:
  // 448 / 0.3 -> 1024) would saturate the 100 to 448 / 1024 and keep the 1e-4 that the true scale flushes to zero.
  const int n = 130;
  std::vector<float> x(static_cast<std::size_t>(n) * n, 0.0f), y(x.size());
  auto at = [&](int r, int c) { return static_cast<std::size_t>(r) * n + c; };
  x[at(0, 0)] = 0.3f;
  x[at(0, 1)] = 1e-4f;   // 4e-4 after scaling: under half E4M3's smallest subnormal (2^-10)
  x[at(0, 2)] = -0.05f;  // 0.2 -> 0.203125 (grid 1/64 in [0.125, 0.25))
  x[at(127, 127)] = 100.0f;
  x[at(128, 0)] = 0.02f;     // block (1, 0), rows 128..129: its own amax 0.02 (scale 16384)
  x[at(5, 129)] = 0.0123f;  // block (0, 1), columns 128..129: its own amax (scale 32768)
  fp8_quantize_dequantize_blocks(y.data(), x.data(), n, n, 128, E4M3);
  EXPECT_EQ(y[at(127, 127)], 96.0f);  // 400 is a tie between 384 (even) and 416: 384 / 4
  EXPECT_EQ(y[at(0, 0)], 0.3125f);    // 1.2 -> 1.25
  EXPECT_EQ(y[at(0, 1)], 0.0f);
  EXPECT_EQ(y[at(0, 2)], -0.203125f / 4);
  EXPECT_EQ(y[at(128, 0)], 320.0f / 16384);  // 327.68 -> 320, untouched by block (0, 0)'s 100
  EXPECT_EQ(y[at(5, 129)], 416.0f / 32768);  // 403.05 -> 416 (grid 32 in [256, 512))
  // Every element of block (0, 0) read back with the one scale 4.
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 128; ++c) {
      ASSERT_EQ(y[at(r, c)], round_to_fp8(x[at(r, c)] * 4.0f, E4M3) / 4.0f) << r << " " << c;
    }
  }
}

TEST(CpuFp8, Mxfp8ScalesAreE8M0PowersOfTwo) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  // amax 3: 3 / 448 = 2^-7.2, rounded up to 2^-7 (TE); floor(log2 3) - 8 = -7 (OCP): the same.
  EXPECT_EQ(mx_scale_bits(3.0f, E4M3), 120);
  EXPECT_EQ(mx_scale_bits(3.0f, E4M3, MxScaleRule::Ocp), 120);
  // amax 500: TE takes 2^1 (500 / 2 = 250 fits), OCP 2^0 (500 clamps to 448).
  EXPECT_EQ(mx_scale_bits(500.0f, E4M3), 128);
  EXPECT_EQ(mx_scale_bits(500.0f, E4M3, MxScaleRule::Ocp), 127);
  EXPECT_EQ(mx_scale_bits(448.0f, E4M3), 127);  // exactly the largest: no rounding up
  EXPECT_EQ(mx_scale_bits(57344.0f * 4, E5M2), 129);
  EXPECT_EQ(mx_scale_bits(0.0f, E4M3), 0);
  EXPECT_EQ(mx_scale_bits(std::numeric_limits<float>::quiet_NaN(), E4M3), 255);
  // One row of 40: a block of 32 with amax 500, and a tail block of 8 with amax 0.1.
  std::vector<float> x(40, 0.0f), y(40), z(40);
  x[0] = 500.0f;
  x[1] = 7.0f;
  x[32] = 0.1f;
  mxfp8_quantize_dequantize(y.data(), x.data(), 1, 40, E4M3);
  EXPECT_EQ(y[0], 512.0f);                           // 250 -> 256 (grid 16), times 2
  EXPECT_EQ(y[1], 7.0f);                             // 3.5 is on the grid
  EXPECT_EQ(y[32], 416.0f * std::ldexp(1.0f, -12));  // scale 2^-12: 409.6 -> 416 (grid 32)
  mxfp8_quantize_dequantize(z.data(), x.data(), 1, 40, E4M3, MxScaleRule::Ocp);
  EXPECT_EQ(z[0], 448.0f);  // clamped
}

TEST(CpuFp8, RejectsAScaleThatCannotBeUsed) {
  std::vector<float> x(4, 1.0f);
  EXPECT_THROW(fp8_quantize_dequantize(x.data(), x.data(), x.size(), 0.0f, E4M3), std::invalid_argument);
  EXPECT_THROW(fp8_quantize_dequantize(x.data(), x.data(), x.size(), kInf, E4M3), std::invalid_argument);
  EXPECT_THROW(fp8_quantize_dequantize_row_tiles(x.data(), x.data(), 1, 4, 0, E4M3), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

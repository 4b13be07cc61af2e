// fp32 <-> bf16: round to nearest even on exact bit patterns, infinities, NaN, and an exhaustive round trip.
#include "kernels/cpu/cast.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace twin::kernels::cpu {
namespace {

std::uint16_t bf16_of_bits(std::uint32_t bits) {
  return float_to_bf16(std::bit_cast<float>(bits));
}

TEST(CpuCast, RoundsToNearestEven) {
  EXPECT_EQ(bf16_of_bits(0x3f800000u), 0x3f80u);   // 1.0 exact
  EXPECT_EQ(bf16_of_bits(0x3f807fffu), 0x3f80u);   // just below half an ulp: down
  EXPECT_EQ(bf16_of_bits(0x3f808000u), 0x3f80u);   // tie, 0x3f80 even: down
  EXPECT_EQ(bf16_of_bits(0x3f808001u), 0x3f81u);   // just above half: up
  EXPECT_EQ(bf16_of_bits(0x3f818000u), 0x3f82u);   // tie, 0x3f81 odd: up to even
  EXPECT_EQ(bf16_of_bits(0xbf818000u), 0xbf82u);   // same, negative
  EXPECT_EQ(bf16_of_bits(0x3f7fffffu), 0x3f80u);   // mantissa carry into the exponent
  EXPECT_EQ(bf16_of_bits(0x80000000u), 0x8000u);   // -0 keeps its sign
  EXPECT_EQ(bf16_of_bits(0x00018000u), 0x0002u);   // subnormal tie, odd: up
  EXPECT_EQ(float_to_bf16(3.14159265f), 0x4049u);  // pi = 0x40490fdb -> 0x4049
}

TEST(CpuCast, InfinityAndOverflow) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80u);
  EXPECT_EQ(bf16_of_bits(0x7f7fffffu), 0x7f80u);  // FLT_MAX is past the largest bf16 + half ulp: inf
  EXPECT_EQ(bf16_of_bits(0x7f7f7fffu), 0x7f7fu);  // largest bf16 stays finite
  EXPECT_TRUE(std::isinf(bf16_to_float(0x7f80u)));
}

TEST(CpuCast, NaNStaysNaN) {
  for (std::uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu}) {
    const std::uint16_t bf16 = bf16_of_bits(bits);
    EXPECT_TRUE(std::isnan(bf16_to_float(bf16))) << std::hex << bits << " -> " << bf16;
    EXPECT_EQ(bf16 & 0x8000u, (bits >> 16) & 0x8000u) << "sign of " << std::hex << bits;
  }
}

TEST(CpuCast, EveryBf16RoundTripsExactly) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bf16 = static_cast<std::uint16_t>(b);
    const float x = bf16_to_float(bf16);
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_bf16(x), bf16) << std::hex << b;
  }
}

TEST(CpuCast, ArrayCastsAndRounding) {
  const std::vector<float> x = {1.0f, std::bit_cast<float>(0x3f818000u), -2.5f, 1e-3f};
  std::vector<std::uint16_t> bf16(x.size());
  cast_float_to_bf16(bf16.data(), x.data(), x.size());
  std::vector<float> back(x.size()), rounded(x.size());
  cast_bf16_to_float(back.data(), bf16.data(), x.size());
  round_to_bf16(rounded.data(), x.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bf16[i], float_to_bf16(x[i]));
    EXPECT_EQ(back[i], rounded[i]);
    EXPECT_NEAR(back[i], x[i], std::abs(x[i]) * (1.0f / 256));  // 8 significant bits
  }
  EXPECT_EQ(back[1], std::bit_cast<float>(0x3f820000u));
}

}  // namespace
}  // namespace twin::kernels::cpu

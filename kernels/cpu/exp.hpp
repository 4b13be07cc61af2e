// Internal to the CPU kernels: e^a without a libm call, so that the loops that call it vectorize (libm's scalar expf
// keeps them one element at a time: a third of the attention forward, half of the GELU).
//
// Cephes' expf (S. L. Moshier): 2^k e^r with k = round(a / ln 2), r = a - k ln 2 in two parts, e^r by a degree-7
// polynomial: within 1 ulp of exp on [-87, 88]; 0 below -87 (e^-87 < 2e-38) and for -inf; NaN stays NaN; undefined
// above 88.7 (callers keep below it). Branch-free, the range test on the bits. Each result's bits depend on a alone.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace twin::kernels::cpu::detail {

inline float exp_cephes(float a) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: v + kRound holds round(v) in its low mantissa bits
  constexpr std::uint32_t kMinus87 = std::bit_cast<std::uint32_t>(-87.0f);
  constexpr std::uint32_t kMinusInf = std::bit_cast<std::uint32_t>(-std::numeric_limits<float>::infinity());
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(a);
  // all ones when a is in [-inf, -87): negative floats order as their bits, and NaNs lie above -inf's
  const std::uint32_t below = 0u - static_cast<std::uint32_t>((bits > kMinus87) & (bits <= kMinusInf));
  const float clamped = std::bit_cast<float>((bits & ~below) | (kMinus87 & below));  // >= -87
  const float k_plus = clamped * kLog2e + kRound;
  const float k = k_plus - kRound;
  const float r = (clamped - k * kLn2Hi) - k * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float exp_r = poly * (r * r) + r + 1.0f;
  const std::uint32_t k_int = std::bit_cast<std::uint32_t>(k_plus) - std::bit_cast<std::uint32_t>(kRound);
  const float two_k = std::bit_cast<float>((k_int + 127u) << 23);  // 2^k, k in [-126, 128)
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(exp_r * two_k) & ~below);
}

}  // namespace twin::kernels::cpu::detail

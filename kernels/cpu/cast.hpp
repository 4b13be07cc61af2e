// fp32 <-> bf16 conversions. bf16 is the upper half of an fp32 (1 sign, 8 exponent, 7 mantissa bits), held here as
// its raw bits in a std::uint16_t (the layout of CUDA's __nv_bfloat16). fp32 -> bf16 rounds to nearest, ties to even,
// as __float2bfloat16_rn; infinities stay infinities, finite values past the largest bf16 round to infinity, and NaN
// stays NaN (quiet, sign kept). bf16 -> fp32 is exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace twin::kernels::cpu {

inline std::uint16_t float_to_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload bits, force the quiet bit
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);  // half an ulp, minus one unless odd: ties even
  return static_cast<std::uint16_t>((bits + rounding_bias) >> 16);
}

inline float bf16_to_float(std::uint16_t x) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(x) << 16);
}

// out (n) bf16 bits <- inp (n) fp32, rounded to nearest even
void cast_float_to_bf16(std::uint16_t* out, const float* inp, std::size_t n);

// out (n) fp32 <- inp (n) bf16 bits, exact
void cast_bf16_to_float(float* out, const std::uint16_t* inp, std::size_t n);

// out (n) = bf16_to_float(float_to_bf16(inp (n))): fp32 values rounded to bf16 precision, to emulate bf16 storage in
// the fp32 kernels. out may alias inp.
void round_to_bf16(float* out, const float* inp, std::size_t n);

}  // namespace twin::kernels::cpu

// FP8 quantization formulas shared by the CUDA kernels (kernels/cuda/fp8.cu) and the host: the twins of
// kernels/cpu/fp8.hpp's scalar functions (formats, rounding, saturation, the scale from an amax, E8M0 block scales),
// written with integer bit operations and correctly rounded fp32 operations so that g++ and nvcc compute the same
// bits. tests/kernels_cuda/fp8_host_test.cpp checks every function here against kernels/cpu bit for bit.
//
//   E4M3  bias 7,  3 mantissa bits, largest 448,   no infinities, S.1111.111 NaN
//   E5M2  bias 15, 2 mantissa bits, largest 57344, IEEE infinities and NaNs
// fp32 -> FP8 rounds to nearest even and saturates finite values and infinities to the largest value (CUDA's
// __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN stays NaN.
#pragma once

#include <cstdint>

#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda::fp8 {

enum class Fp8Format : std::uint8_t { E4M3, E5M2 };

struct FormatInfo {
  int mantissa_bits;
  int bias;
  float max;            // largest finite value
  float saturate_from;  // the largest value plus half its ulp: from here on (and for infinities) the largest value
  int emax;             // exponent of the largest normal (MX's emax_elem)
  std::uint8_t max_bits, nan_bits;  // sign aside
};

TWIN_HOST_DEVICE inline FormatInfo info(Fp8Format format) {
  if (format == Fp8Format::E4M3) return FormatInfo{3, 7, 448.0f, 464.0f, 8, 0x7e, 0x7f};
  return FormatInfo{2, 15, 57344.0f, 61440.0f, 15, 0x7b, 0x7e};
}

TWIN_HOST_DEVICE inline float fp8_max(Fp8Format format) {
  return info(format).max;
}

TWIN_HOST_DEVICE inline bool is_nan(float x) {
  return (math::bits_of(x) & 0x7fffffffu) > 0x7f800000u;
}
TWIN_HOST_DEVICE inline bool is_finite(float x) {
  return (math::bits_of(x) & 0x7f800000u) != 0x7f800000u;
}

// 2^e as a normal fp32, -126 <= e <= 127
TWIN_HOST_DEVICE inline float pow2(int e) {
  return math::float_of(static_cast<std::uint32_t>(e + 127) << 23);
}

// The unbiased exponent of a normal fp32 (-127 for zeros and subnormals, which the rounding treats alike)
TWIN_HOST_DEVICE inline int exponent_of(float a) {
  return static_cast<int>((math::bits_of(a) >> 23) & 0xffu) - 127;
}

TWIN_HOST_DEVICE inline float round_to_nearest_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);  // the default rounding mode: ties to even, as kernels/cpu/fp8.cpp
#endif
}

// |x| (not NaN) rounded to the format: a multiple of the quantum at its binade (the subnormal quantum below the
// smallest normal), or the largest value from saturate_from on.
TWIN_HOST_DEVICE inline float round_magnitude(float a, const FormatInfo& f) {
  if (a >= f.saturate_from) return f.max;  // infinities too
  const int min_normal_exponent = 1 - f.bias;
  const int e = exponent_of(a) > min_normal_exponent ? exponent_of(a) : min_normal_exponent;
  const int quantum_exponent = e - f.mantissa_bits;
  // a / quantum and back: exact multiplications by powers of two
  const float r = round_to_nearest_even(math::mul_rn(a, pow2(-quantum_exponent))) * pow2(quantum_exponent);
  return r < f.max ? r : f.max;
}

TWIN_HOST_DEVICE inline float copy_sign(float magnitude, float sign_of) {
  return math::float_of((math::bits_of(magnitude) & 0x7fffffffu) | (math::bits_of(sign_of) & 0x80000000u));
}

// fp32 -> the nearest FP8 value, saturated, read back as fp32 (kernels/cpu round_to_fp8)
TWIN_HOST_DEVICE inline float round_to_fp8(float x, Fp8Format format) {
  if (is_nan(x)) return x;
  return copy_sign(round_magnitude(math::float_of(math::bits_of(x) & 0x7fffffffu), info(format)), x);
}

// fp32 -> FP8 bits (kernels/cpu float_to_fp8)
TWIN_HOST_DEVICE inline std::uint8_t float_to_fp8(float x, Fp8Format format) {
  const FormatInfo f = info(format);
  const auto sign = static_cast<std::uint8_t>((math::bits_of(x) >> 24) & 0x80u);
  if (is_nan(x)) return static_cast<std::uint8_t>(sign | f.nan_bits);
  const float q = round_magnitude(math::float_of(math::bits_of(x) & 0x7fffffffu), f);
  if (q == 0.0f) return sign;
  const int e = exponent_of(q);  // q is a normal fp32 (at least 2^-16)
  const int m = f.mantissa_bits;
  if (e < 1 - f.bias) {  // subnormal: q in units of the smallest subnormal
    return static_cast<std::uint8_t>(sign | static_cast<int>(math::mul_rn(q, pow2(f.bias - 1 + m))));
  }
  const auto mantissa = static_cast<int>((math::bits_of(q) >> (23 - m)) & ((1u << m) - 1u));
  return static_cast<std::uint8_t>(sign | ((e + f.bias) << m) | mantissa);
}

// FP8 bits -> fp32, exact (kernels/cpu fp8_to_float)
TWIN_HOST_DEVICE inline float fp8_to_float(std::uint8_t bits, Fp8Format format) {
  const FormatInfo f = info(format);
  const int m = f.mantissa_bits;
  const int field = (bits & 0x7f) >> m;
  const int mantissa = bits & ((1 << m) - 1);
  const std::uint32_t sign = (bits & 0x80u) << 24;
  if (format == Fp8Format::E4M3 && (bits & 0x7f) == 0x7f) return math::float_of(0x7fc00000u);
  if (format == Fp8Format::E5M2 && field == 31) return math::float_of(mantissa == 0 ? sign | 0x7f800000u : 0x7fc00000u);
  const float magnitude = field == 0 ? static_cast<float>(mantissa) * pow2(1 - f.bias - m)
                                     : static_cast<float>((1 << m) + mantissa) * pow2(field - f.bias - m);
  return math::float_of(math::bits_of(magnitude) | sign);
}

// Transformer Engine's scale for an amax (kernels/cpu fp8_scale_from_amax): fp8_max / amax / 2^margin; an amax of 0,
// infinity or NaN keeps previous_scale; past fp32's range fp32's largest; power_of_two keeps the exponent only.
TWIN_HOST_DEVICE inline float scale_from_amax(float amax, float fp8_max_value, float previous_scale, int margin = 0,
                                              bool power_of_two = false) {
  if (!(amax > 0.0f) || !is_finite(amax)) return previous_scale;
  float scale = math::div_rn(math::div_rn(fp8_max_value, amax), pow2(margin));
  if (!is_finite(scale)) scale = math::float_of(0x7f7fffffu);
  if (power_of_two) scale = math::float_of(math::bits_of(scale) & 0xff800000u);
  return scale;
}

// x quantized with `scale` and read back: round_to_fp8(x * scale) / scale (kernels/cpu fp8_quantize_dequantize)
TWIN_HOST_DEVICE inline float quantize_dequantize(float x, float scale, Fp8Format format) {
  const float scaled = math::mul_rn(x, scale);
  if (is_nan(scaled)) return scaled;
  return math::div_rn(round_to_fp8(scaled, format), scale);
}

// --- MX (OCP Microscaling v1.0): an E8M0 scale per 32 elements -------------------------------------------------------
inline constexpr int kMxBlock = 32;
enum class MxScaleRule : std::uint8_t { TransformerEngine, Ocp };  // kernels/cpu/fp8.hpp says what each is

// 2^e as a double (-1022 <= e <= 1023)
TWIN_HOST_DEVICE inline double pow2_double(int e) {
  const std::uint64_t bits = static_cast<std::uint64_t>(e + 1023) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// floor(log2(a)) of a finite a > 0 (fp32 subnormals included: exact in double)
TWIN_HOST_DEVICE inline int floor_log2(float a) {
  const double d = static_cast<double>(a);
#if defined(__CUDA_ARCH__)
  const auto bits = static_cast<std::uint64_t>(__double_as_longlong(d));
#else
  std::uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof bits);
#endif
  return static_cast<int>((bits >> 52) & 0x7ffu) - 1023;
}

// E8M0 bits of a block's scale from its amax (kernels/cpu mx_scale_bits): 0xFF for NaN, 0xFE for infinity, 0x00 for 0
TWIN_HOST_DEVICE inline std::uint8_t mx_scale_bits(float amax, Fp8Format format,
                                                   MxScaleRule rule = MxScaleRule::TransformerEngine) {
  if (is_nan(amax)) return 0xff;
  if (!is_finite(amax)) return 0xfe;
  if (amax == 0.0f) return 0x00;
  const FormatInfo f = info(format);
  int e = floor_log2(amax) - f.emax;
  if (rule == MxScaleRule::TransformerEngine) {
    // the smallest e with fp8_max 2^e >= amax, compared exactly in double
    const double max = f.max, a = amax;
    while (max * pow2_double(e) < a) ++e;
    while (max * pow2_double(e - 1) >= a) --e;
  }
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return static_cast<std::uint8_t>(e + 127);
}

// 2^(bits - 127); NaN for 0xFF
TWIN_HOST_DEVICE inline float e8m0_to_float(std::uint8_t bits) {
  if (bits == 0xff) return math::float_of(0x7fc00000u);
  if (bits == 0x00) return math::float_of(0x00400000u);  // 2^-127, an fp32 subnormal
  return math::float_of(static_cast<std::uint32_t>(bits) << 23);
}

// x of an MX block with scale 2^(bits - 127) read back: round_to_fp8(x / scale) * scale (exact divisions)
TWIN_HOST_DEVICE inline float mx_quantize_dequantize(float x, float scale, Fp8Format format) {
  const float scaled = math::div_rn(x, scale);
  if (is_nan(scaled)) return scaled;
  return math::mul_rn(round_to_fp8(scaled, format), scale);
}

}  // namespace twin::kernels::cuda::fp8

// FP8 rounding on the value: the rounded magnitude is a multiple of the format's quantum at the value's binade (its
// subnormal quantum below the smallest normal), rounded to the nearest multiple, ties to even. The bit patterns follow
// from the rounded value.
#include "kernels/cpu/fp8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "kernels/cpu/check.hpp"

namespace twin::kernels::cpu {

namespace {

struct FormatInfo {
  int mantissa_bits;
  int bias;
  float max;            // largest finite value
  float saturate_from;  // the largest value plus half its ulp: from here on (and for infinities) the largest value
  int emax;             // exponent of the largest normal (MX's emax_elem)
  std::uint8_t nan;     // canonical NaN bits, sign aside
};

constexpr FormatInfo kE4M3{3, 7, 448.0f, 464.0f, 8, 0x7f};
constexpr FormatInfo kE5M2{2, 15, 57344.0f, 61440.0f, 15, 0x7e};

const FormatInfo& info(Fp8Format format) {
  return format == Fp8Format::E4M3 ? kE4M3 : kE5M2;
}

// The magnitude a >= 0 (not NaN) rounded to the format. On the bits, not through ilogb, ldexp and nearbyint: those
// library calls were over half of FP8 training's time on the CPU. The same value: a's binade is its exponent field
// (fp32 subnormals and 0 fall below every FP8 binade), the quantum and its inverse are powers of two (a / quantum and
// the product are exact), and adding then subtracting 2^23 rounds a value below 2^22 to an integer, ties to even, as
// nearbyint does in the default rounding mode (v < 2^(mantissa bits + 1) here).
float round_magnitude(float a, const FormatInfo& f) {
  if (a >= f.saturate_from) return f.max;  // infinities too
  const int min_normal_exponent = 1 - f.bias;
  const int exponent = std::max(static_cast<int>(std::bit_cast<std::uint32_t>(a) >> 23) - 127, min_normal_exponent);
  const int quantum_exponent = exponent - f.mantissa_bits;
  const float quantum = std::bit_cast<float>(static_cast<std::uint32_t>(quantum_exponent + 127) << 23);
  const float inverse = std::bit_cast<float>(static_cast<std::uint32_t>(127 - quantum_exponent) << 23);
  constexpr float kRoundToInteger = 8388608.0f;  // 2^23
  const float rounded = (a * inverse + kRoundToInteger) - kRoundToInteger;
  return std::min(f.max, rounded * quantum);
}

}  // namespace

float fp8_max(Fp8Format format) {
  return info(format).max;
}

float round_to_fp8(float x, Fp8Format format) {
  if (std::isnan(x)) return x;
  return std::copysign(round_magnitude(std::fabs(x), info(format)), x);
}

std::uint8_t float_to_fp8(float x, Fp8Format format) {
  const FormatInfo& f = info(format);
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | f.nan);
  const float q = round_magnitude(std::fabs(x), f);
  if (q == 0) return sign;
  const int exponent = std::ilogb(q);
  const int m = f.mantissa_bits;
  if (exponent < 1 - f.bias) {  // subnormal: the value in units of the smallest subnormal
    return static_cast<std::uint8_t>(sign | static_cast<int>(std::ldexp(q, f.bias - 1 + m)));
  }
  const int mantissa = static_cast<int>(std::ldexp(q, m - exponent)) - (1 << m);
  return static_cast<std::uint8_t>(sign | ((exponent + f.bias) << m) | mantissa);
}

float fp8_to_float(std::uint8_t bits, Fp8Format format) {
  const FormatInfo& f = info(format);
  const int m = f.mantissa_bits;
  const int field = (bits & 0x7f) >> m;
  const int mantissa = bits & ((1 << m) - 1);
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (format == Fp8Format::E4M3 && (bits & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (format == Fp8Format::E5M2 && field == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  if (field == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - f.bias - m);
  return sign * std::ldexp(static_cast<float>((1 << m) + mantissa), field - f.bias - m);
}

float absolute_max(const float* x, std::size_t n) {
  float amax = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

float fp8_scale_from_amax(float amax, float fp8_max_value, float previous_scale, int margin, bool power_of_two) {
  // transformer_engine/pytorch/quantization.py _default_sf_compute; force_pow_2_scales as recipe_common.cuh.
  if (!(amax > 0) || !std::isfinite(amax)) return previous_scale;
  float scale = fp8_max_value / amax / std::ldexp(1.0f, margin);
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  if (power_of_two) scale = std::bit_cast<float>(std::bit_cast<std::uint32_t>(scale) & 0xff800000u);
  return scale;
}

void fp8_quantize_dequantize(float* out, const float* inp, std::size_t n, float scale, Fp8Format format) {
  TWIN_KERNEL_CHECK(scale > 0 && std::isfinite(scale));
  const FormatInfo& f = info(format);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = inp[i] * scale;
    out[i] = std::isnan(x) ? x : std::copysign(round_magnitude(std::fabs(x), f), x) / scale;
  }
}

DelayedScaling::DelayedScaling(int history_length, bool use_max, int margin)
    : history_(static_cast<std::size_t>(std::max(1, history_length)), 0.0f), use_max_(use_max), margin_(margin) {}

void DelayedScaling::record(float amax) {
  history_[0] = std::isnan(amax) ? amax : std::max(history_[0], amax);
}

void DelayedScaling::update(float fp8_max_value) {
  // _default_get_amax_and_update_history: the window's max (or the most recent), then torch.roll(-1) and a fresh
  // slot 0, so that a window of L steps drops the oldest once L have been recorded.
  float amax = history_[0];
  if (use_max_) {
    for (float a : history_)
      amax = std::isnan(a) || std::isnan(amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(amax, a);
  }
  scale_ = fp8_scale_from_amax(amax, fp8_max_value, scale_, margin_);
  std::rotate(history_.begin(), history_.begin() + 1, history_.end());
  history_[0] = 0.0f;
}

void DelayedScaling::restore(const std::vector<float>& history, float scale) {
  TWIN_KERNEL_CHECK(history.size() == history_.size());
  history_ = history;
  scale_ = scale;
}

void fp8_quantize_dequantize_row_tiles(float* out, const float* inp, int rows, int cols, int tile, Fp8Format format,
                                       bool power_of_two) {
  TWIN_KERNEL_CHECK(rows >= 0 && cols >= 0 && tile >= 1);
  const float max = fp8_max(format);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; c += tile) {
      const std::size_t offset = static_cast<std::size_t>(r) * cols + c;
      const std::size_t n = static_cast<std::size_t>(std::min(tile, cols - c));
      const float scale = fp8_scale_from_amax(absolute_max(inp + offset, n), max, 1.0f, 0, power_of_two);
      fp8_quantize_dequantize(out + offset, inp + offset, n, scale, format);
    }
  }
}

void fp8_quantize_dequantize_blocks(float* out, const float* inp, int rows, int cols, int block, Fp8Format format,
                                    bool power_of_two) {
  TWIN_KERNEL_CHECK(rows >= 0 && cols >= 0 && block >= 1);
  const float max = fp8_max(format);
  for (int r0 = 0; r0 < rows; r0 += block) {
    for (int c0 = 0; c0 < cols; c0 += block) {
      const int r1 = std::min(rows, r0 + block), width = std::min(block, cols - c0);
      float amax = 0;
      for (int r = r0; r < r1; ++r) {
        const float row_max = absolute_max(inp + static_cast<std::size_t>(r) * cols + c0, width);
        amax =
            std::isnan(row_max) || std::isnan(amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(amax, row_max);
      }
      const float scale = fp8_scale_from_amax(amax, max, 1.0f, 0, power_of_two);
      for (int r = r0; r < r1; ++r) {
        const std::size_t offset = static_cast<std::size_t>(r) * cols + c0;
        fp8_quantize_dequantize(out + offset, inp + offset, static_cast<std::size_t>(width), scale, format);
      }
    }
  }
}

std::uint8_t mx_scale_bits(float amax, Fp8Format format, MxScaleRule rule) {
  if (std::isnan(amax)) return 0xff;
  if (std::isinf(amax)) return 0xfe;
  if (amax == 0) return 0x00;
  int exponent = 0;
  if (rule == MxScaleRule::Ocp) {
    exponent = std::ilogb(amax) - info(format).emax;
  } else {
    // The smallest power of two 2^e with fp8_max * 2^e >= amax (the exact quotient rounded up to E8M0).
    const double max = fp8_max(format);
    exponent = static_cast<int>(std::ceil(std::log2(amax / max)));
    while (std::ldexp(max, exponent) < amax) ++exponent;
    while (std::ldexp(max, exponent - 1) >= amax) --exponent;
  }
  return static_cast<std::uint8_t>(std::clamp(exponent, -127, 127) + 127);
}

float e8m0_to_float(std::uint8_t bits) {
  if (bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

void mxfp8_quantize_dequantize(float* out, const float* inp, int rows, int cols, Fp8Format format, MxScaleRule rule) {
  TWIN_KERNEL_CHECK(rows >= 0 && cols >= 0);
  const FormatInfo& f = info(format);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; c += kMxBlock) {
      const std::size_t offset = static_cast<std::size_t>(r) * cols + c;
      const int n = std::min(kMxBlock, cols - c);
      const float scale = e8m0_to_float(mx_scale_bits(absolute_max(inp + offset, n), format, rule));
      for (int i = 0; i < n; ++i) {
        const float x = inp[offset + i] / scale;  // exact: a power of two
        out[offset + i] = std::isnan(x) ? x : std::copysign(round_magnitude(std::fabs(x), f), x) * scale;
      }
    }
  }
}

}  // namespace twin::kernels::cpu

// FP8 numerics on the CPU: what an FP8 GEMM's operands become, so that FP8 training runs (emulated) anywhere.
//
// Formats (OCP 8-bit Floating Point Specification (OFP8), revision 1.0, 2023):
//   E4M3  1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN; largest 448 (S.1111.110),
//         smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2  1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like infinities and NaNs; largest 57344 (S.11110.11),
//         smallest normal 2^-14, smallest subnormal 2^-16.
// fp32 -> FP8 rounds to nearest, ties to even, and saturates: finite values and infinities past the largest finite
// value become it, sign kept (CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE, the conversion of Transformer
// Engine's casts); NaN stays NaN; magnitudes at or below half the smallest subnormal become a zero of the same sign.
//
// Scaling recipes (Transformer Engine, transformer_engine/common/recipe/__init__.py): a tensor x is stored as
// fp8(x * scale) and read back as fp8 / scale, with
//   delayed     one scale per tensor, from the amaxes of earlier steps (DelayedScaling: a window of
//               amax_history_len amaxes, their max or the most recent; scale = fp8_max / amax / 2^margin);
//   tensorwise  one scale per tensor from its own amax (Float8CurrentScaling);
//   blockwise   a power-of-2 scale per 1 x 128 tile of a row (activations, gradients) or per 128 x 128 block
//               (weights): Float8BlockScaling, after DeepSeek-V3's fine-grained quantization (arXiv:2412.19437, 3.3);
//   mxfp8       32 consecutive elements of a row share an E8M0 scale, a power of two 2^(e - 127) (OCP Microscaling
//               Formats (MX) Specification v1.0, 2023), stored as fp8(x / 2^(e - 127)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace twin::kernels::cpu {

enum class Fp8Format : std::uint8_t { E4M3, E5M2 };

// Largest finite value: 448 (E4M3) or 57344 (E5M2).
float fp8_max(Fp8Format format);

// fp32 -> FP8 bits, rounded to nearest even and saturated (see above); NaN -> S.1111.111 (E4M3) or S.11111.10 (E5M2).
std::uint8_t float_to_fp8(float x, Fp8Format format);
// FP8 bits -> fp32, exact.
float fp8_to_float(std::uint8_t bits, Fp8Format format);
// fp8_to_float(float_to_fp8(x, format)), computed on the value.
float round_to_fp8(float x, Fp8Format format);

// Largest |x| of x (n); 0 for n = 0; NaN if any element is NaN.
float absolute_max(const float* x, std::size_t n);

// Transformer Engine's scale for an amax: fp8_max / amax / 2^margin; an amax of 0, infinity or NaN keeps
// `previous_scale`; a scale past fp32's range becomes fp32's largest; power_of_two keeps only the scale's exponent
// (rounds it down to a power of two: force_pow_2_scales).
float fp8_scale_from_amax(float amax, float fp8_max_value, float previous_scale, int margin = 0,
                          bool power_of_two = false);

// out (n) = round_to_fp8(inp (n) * scale) / scale: one tensor quantized with one scale and read back. out may alias
// inp.
void fp8_quantize_dequantize(float* out, const float* inp, std::size_t n, float scale, Fp8Format format);

// Delayed scaling of one tensor (DelayedScaling): quantize with scale(), record() the amax of what was quantized,
// and update() once per step: the new scale from the window's amax, then the window moves on (the oldest amax
// drops out once `history_length` steps have been recorded).
class DelayedScaling {
 public:
  explicit DelayedScaling(int history_length = 1024, bool use_max = true, int margin = 0);
  float scale() const { return scale_; }
  void record(float amax);  // the largest of this step's amaxes is kept
  void update(float fp8_max_value);
  const std::vector<float>& amax_history() const { return history_; }  // [0]: this step's, then oldest to newest
  // Puts back a state read from scale() and amax_history() (a checkpoint's); `history` has this object's length.
  void restore(const std::vector<float>& history, float scale);

 private:
  std::vector<float> history_;
  bool use_max_;
  int margin_;
  float scale_ = 1.0f;
};

// inp (rows, cols) quantized in 1 x `tile` tiles of each row (the last tile of a row may be shorter), each tile with
// its own scale from its amax (power_of_two: Float8BlockScaling's default), read back into out (rows, cols).
void fp8_quantize_dequantize_row_tiles(float* out, const float* inp, int rows, int cols, int tile, Fp8Format format,
                                       bool power_of_two = true);
// The same in `block` x `block` blocks (the weights' 128 x 128).
void fp8_quantize_dequantize_blocks(float* out, const float* inp, int rows, int cols, int block, Fp8Format format,
                                    bool power_of_two = true);

// How an MX block's E8M0 exponent follows from its amax:
//   TransformerEngine  the smallest power of two with amax / 2^X <= fp8_max, so no element saturates (TE's
//                      float_to_e8m0(amax / fp8_max), PTX cvt.rp.satfinite.ue8m0x2.f32);
//   Ocp                X = floor(log2(amax)) - emax of the element format (8 for E4M3, 15 for E5M2), elements past
//                      the largest normal clamped to it (MX specification v1.0, section 6.3).
enum class MxScaleRule : std::uint8_t { TransformerEngine, Ocp };
inline constexpr int kMxBlock = 32;
// E8M0 bits of a block's scale: 2^(bits - 127), 0xFF NaN (an amax of NaN), 0xFE the largest (an infinite amax);
// an amax of 0 gives 0x00 (2^-127).
std::uint8_t mx_scale_bits(float amax, Fp8Format format, MxScaleRule rule = MxScaleRule::TransformerEngine);
float e8m0_to_float(std::uint8_t bits);
// inp (rows, cols) in blocks of kMxBlock consecutive elements of a row (the last block of a row may be shorter), each
// stored as fp8(x / scale) with its E8M0 scale, read back into out (rows, cols).
void mxfp8_quantize_dequantize(float* out, const float* inp, int rows, int cols, Fp8Format format,
                               MxScaleRule rule = MxScaleRule::TransformerEngine);

}  // namespace twin::kernels::cpu

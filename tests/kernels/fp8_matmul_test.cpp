// FP8 GEMMs emulated (kernels/cpu/fp8_matmul.hpp): each GEMM multiplies its operands as quantized along its own
// reduction dimension, on hand-checkable shapes; the FP8 result stays within FP8's precision of fp32.
#include "kernels/cpu/fp8_matmul.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/matmul.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::random_vector;

std::vector<float> transposed(const std::vector<float>& x, int rows, int cols) {
  std::vector<float> t(x.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c) * rows + r] = x[static_cast<std::size_t>(r) * cols + c];
  }
  return t;
}

TEST(CpuFp8Matmul, ColumnBlocksAreTheTransposesRowBlocks) {
  // A 3 x 64 operand: row blocks of 32 along each row; column blocks run down the 3 rows instead.
  std::vector<float> x(3 * 64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 29) * (i % 2 ? -1.0f : 1.0f);
  x[5] = 100.0f;  // in its row block the scale becomes 2^-2 (100 / 448 rounded up) ...
  x[1] = 1e-4f;   // ... which crushes this one (4e-4 is under half E4M3's smallest subnormal, 2^-10) to zero,
  const Fp8Operand mx{Fp8Format::E4M3, Fp8Scaling::Mx};  // while down its column (amax 0.13: scale 2^-11) it lives
  std::vector<float> rows(x.size()), columns(x.size()), check(x.size());
  fp8_quantize_operand(rows.data(), x.data(), 3, 64, mx, false);
  fp8_quantize_operand(columns.data(), x.data(), 3, 64, mx, true);
  const std::vector<float> t = transposed(x, 3, 64);
  fp8_quantize_operand(check.data(), t.data(), 64, 3, mx, false);
  EXPECT_EQ(columns, transposed(check, 64, 3));
  EXPECT_EQ(rows[5], 96.0f);  // 400 is a tie between 384 (even) and 416: 384 x 2^-2
  EXPECT_EQ(rows[1], 0.0f);
  EXPECT_EQ(columns[1], 0.203125f * std::ldexp(1.0f, -11));  // 0.2048 -> 0.203125 (grid 1/64)
  // Per-tensor scales have no direction.
  const Fp8Operand tensor{Fp8Format::E4M3, Fp8Scaling::Current};
  fp8_quantize_operand(rows.data(), x.data(), 3, 64, tensor, false);
  fp8_quantize_operand(columns.data(), x.data(), 3, 64, tensor, true);
  EXPECT_EQ(rows, columns);
}

// ---- An independent reference: E4M3 from the OCP specification's table, scales from Transformer Engine's recipes ----
// Nothing of kernels/cpu/fp8.cpp: the 126 positive finite E4M3 values are listed from their bit fields (OFP8 rev 1.0,
// section 5.3.1: exponent bias 7, subnormals at field 0, S.1111.111 the NaN), a value is rounded to the nearest one by
// search (ties to the even mantissa), and each recipe's scale is computed as its source says.
std::vector<float> e4m3_positive_values() {
  std::vector<float> values;  // ascending; index i has mantissa i % 8
  for (int field = 0; field < 16; ++field) {
    for (int mantissa = 0; mantissa < 8; ++mantissa) {
      if (field == 15 && mantissa == 7) continue;  // NaN
      values.push_back(field == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                  : std::ldexp(static_cast<float>(8 + mantissa), field - 10));
    }
  }
  return values;
}

float reference_e4m3(float x) {
  static const std::vector<float> grid = e4m3_positive_values();
  const float a = std::min(std::fabs(x), grid.back());  // saturating (TE's casts)
  std::size_t best = 0;
  for (std::size_t i = 1; i < grid.size(); ++i) {
    const float d = std::fabs(grid[i] - a), d_best = std::fabs(grid[best] - a);
    if (d < d_best || (d == d_best && i % 2 == 0)) best = i;
  }
  return std::copysign(grid[best], x);
}

float power_of_two_below(float x) {  // force_pow_2_scales: keep the exponent
  int exponent = 0;
  std::frexp(x, &exponent);
  return std::ldexp(1.0f, exponent - 1);
}

// inp (rows, cols) quantized in groups of `group` consecutive elements of a row (cols: one group per row; rows * cols:
// the whole tensor), each group's scale from `scale_of(amax)`, and read back.
template <class ScaleOf>
std::vector<float> reference_quantized(const std::vector<float>& inp, int rows, int cols, int group, bool divide,
                                       ScaleOf scale_of) {
  std::vector<float> out(inp.size());
  const int per_row_groups = group >= cols ? 1 : (cols + group - 1) / group;
  const bool whole = group >= rows * cols;
  for (int r = 0; r < (whole ? 1 : rows); ++r) {
    for (int g = 0; g < per_row_groups; ++g) {
      const std::size_t begin = whole ? 0 : static_cast<std::size_t>(r) * cols + static_cast<std::size_t>(g) * group;
      const std::size_t end = whole ? inp.size() : std::min(begin + group, static_cast<std::size_t>(r + 1) * cols);
      float amax = 0;
      for (std::size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(inp[i]));
      const float scale = scale_of(amax);
      for (std::size_t i = begin; i < end; ++i)
        out[i] = divide ? reference_e4m3(inp[i] / scale) * scale : reference_e4m3(inp[i] * scale) / scale;
    }
  }
  return out;
}

std::vector<float> reference_operand(const std::vector<float>& inp, int rows, int cols, Fp8Scaling scaling,
                                     float per_tensor_scale) {
  switch (scaling) {
    case Fp8Scaling::PerTensor:
      return reference_quantized(inp, rows, cols, rows * cols, false, [&](float) { return per_tensor_scale; });
    case Fp8Scaling::Current:  // Float8CurrentScaling: 448 / amax in fp32
      return reference_quantized(inp, rows, cols, rows * cols, false, [](float amax) { return 448.0f / amax; });
    case Fp8Scaling::Tiles:  // Float8BlockScaling: 1 x 128, power-of-two scales
      return reference_quantized(inp, rows, cols, 128, false,
                                 [](float amax) { return power_of_two_below(448.0f / amax); });
    case Fp8Scaling::Mx:  // MX: the smallest power of two 2^e with 448 * 2^e >= amax, elements divided by it
      return reference_quantized(inp, rows, cols, 32, true, [](float amax) {
        float scale = std::ldexp(1.0f, -127);
        while (448.0f * scale < amax) scale *= 2;
        return scale;
      });
    case Fp8Scaling::Blocks:
      break;
  }
  ADD_FAILURE() << "no reference for this scaling";
  return inp;
}

TEST(CpuFp8Matmul, ForwardMatchesAnIndependentReferenceToFp32Accumulation) {
  // K = 300: two full 1 x 128 tiles and a tail of 44, nine MX blocks and a tail of 12; values over 3 decades so that
  // scales matter. The reference multiplies its own quantized operands in double: the kernel may differ only by fp32
  // accumulation, as its products of two FP8 values times power-of-two or shared scales are exact or nearly so. The
  // bound (K + 2) 2^-24 sum_k |x_k w_k| (Higham's gamma_K for a recursive or blocked sum, plus the bias's add and the
  // per-tensor scales' one rounding of each product) is ~2e-5 relative: one FP8 grid step of one operand element (at
  // least 2^-4 of that element's term) exceeds it on all but negligible terms, so a wrong quantizer fails.
  const int rows = 5, in = 300, out = 7;
  std::vector<float> x = random_vector(rows * in, 13), w = random_vector(out * in, 14);
  const std::vector<float> b = random_vector(out, 15);
  for (std::size_t i = 0; i < x.size(); i += 7) x[i] *= 0.01f;
  for (std::size_t i = 0; i < w.size(); i += 5) w[i] *= 30.0f;
  for (Fp8Scaling scaling : {Fp8Scaling::PerTensor, Fp8Scaling::Current, Fp8Scaling::Tiles, Fp8Scaling::Mx}) {
    const Fp8Operand op{Fp8Format::E4M3, scaling, 8.0f};
    const std::vector<float> xq = reference_operand(x, rows, in, scaling, 8.0f);
    const std::vector<float> wq = reference_operand(w, out, in, scaling, 8.0f);
    std::vector<float> got(rows * out);
    fp8_matmul_forward(got.data(), x.data(), w.data(), b.data(), rows, in, out, op, op);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double want = b[o], magnitude = std::fabs(b[o]);
        for (int k = 0; k < in; ++k) {
          const double term = static_cast<double>(xq[r * in + k]) * wq[o * in + k];
          want += term;
          magnitude += std::fabs(term);
        }
        EXPECT_NEAR(got[r * out + o], want, (in + 2) * std::ldexp(1.0, -24) * magnitude)
            << "scaling " << static_cast<int>(scaling) << " at (" << r << ", " << o << ")";
      }
    }
  }
}

TEST(CpuFp8Matmul, ForwardMultipliesTheQuantizedOperands) {
  const int rows = 5, in = 96, out = 7;
  const std::vector<float> x = random_vector(rows * in, 3), w = random_vector(out * in, 4), b = random_vector(out, 5);
  for (Fp8Scaling scaling : {Fp8Scaling::PerTensor, Fp8Scaling::Current, Fp8Scaling::Tiles, Fp8Scaling::Mx}) {
    const Fp8Operand op{Fp8Format::E4M3, scaling, 64.0f};
    std::vector<float> xq(x.size()), wq(w.size()), want(rows * out), got(rows * out), exact(rows * out);
    fp8_quantize_operand(xq.data(), x.data(), rows, in, op, false);
    fp8_quantize_operand(wq.data(), w.data(), out, in, op, false);
    matmul_forward(want.data(), xq.data(), wq.data(), b.data(), rows, in, out);
    fp8_matmul_forward(got.data(), x.data(), w.data(), b.data(), rows, in, out, op, op);
    EXPECT_EQ(got, want);
    // Within FP8's precision of the fp32 GEMM: each operand is off by at most 2^-4 relative (3 mantissa bits), so a
    // dot product of 96 terms in [-1, 1] moves by well under 96 * 2 * 2^-4 * 1.
    matmul_forward(exact.data(), x.data(), w.data(), b.data(), rows, in, out);
    for (int i = 0; i < rows * out; ++i) EXPECT_NEAR(got[i], exact[i], 1.0) << i;
  }
}

TEST(CpuFp8Matmul, BackwardQuantizesEachOperandAlongItsGemmsK) {
  const int rows = 40, in = 64, out = 33;
  const std::vector<float> x = random_vector(rows * in, 6), w = random_vector(out * in, 7);
  const std::vector<float> g = random_vector(rows * out, 8);
  const Fp8Operand e4m3{Fp8Format::E4M3, Fp8Scaling::Mx}, e5m2{Fp8Format::E5M2, Fp8Scaling::Mx};
  std::vector<float> dinp(rows * in), dweight(out * in, 0.0f), dbias(out, 0.0f);
  fp8_matmul_backward(dinp.data(), dweight.data(), dbias.data(), g.data(), x.data(), w.data(), rows, in, out, e4m3,
                      e4m3, e5m2);
  // dgrad: the gradient along its rows (K = out), the weight along its columns; wgrad: both along their columns.
  std::vector<float> gq(g.size()), wq(w.size()), want_dinp(dinp.size()), want_dweight(dweight.size(), 0.0f);
  std::vector<float> xq(x.size()), want_dbias(out, 0.0f);
  fp8_quantize_operand(gq.data(), g.data(), rows, out, e5m2, false);
  fp8_quantize_operand(wq.data(), w.data(), out, in, e4m3, true);
  detail::gemm(false, false, rows, in, out, gq.data(), wq.data(), 0.0f, want_dinp.data());
  EXPECT_EQ(dinp, want_dinp);
  fp8_quantize_operand(gq.data(), g.data(), rows, out, e5m2, true);
  fp8_quantize_operand(xq.data(), x.data(), rows, in, e4m3, true);
  detail::gemm(true, false, out, in, rows, gq.data(), xq.data(), 1.0f, want_dweight.data());
  EXPECT_EQ(dweight, want_dweight);
  // The bias gradient comes from the unquantized gradient.
  matmul_backward(nullptr, want_dweight.data(), want_dbias.data(), g.data(), x.data(), nullptr, rows, in, out);
  EXPECT_EQ(dbias, want_dbias);
  // dweight accumulates: a second call doubles it.
  std::vector<float> twice = dweight;
  fp8_matmul_backward(nullptr, twice.data(), nullptr, g.data(), x.data(), w.data(), rows, in, out, e4m3, e4m3, e5m2);
  for (std::size_t i = 0; i < twice.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * dweight[i]);
}

}  // namespace
}  // namespace twin::kernels::cpu

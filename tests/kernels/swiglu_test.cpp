// swiglu_forward / swiglu_backward against the double formula, central finite differences, and gates far out in the
// sigmoid's tails.
#include "kernels/cpu/swiglu.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

double sigmoid_reference(double g) {  // the stable form: exp of a non-positive number only
  return g >= 0.0 ? 1.0 / (1.0 + std::exp(-g)) : std::exp(g) / (1.0 + std::exp(g));
}

// out (rows, width) = silu(gate) * up, each inp row [gate (width) | up (width)]
std::vector<double> swiglu_reference(const std::vector<double>& inp, int rows, int width) {
  std::vector<double> out(static_cast<std::size_t>(rows) * width);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      const double g = inp[static_cast<std::size_t>(r) * 2 * width + c];
      const double u = inp[static_cast<std::size_t>(r) * 2 * width + width + c];
      out[static_cast<std::size_t>(r) * width + c] = g * sigmoid_reference(g) * u;
    }
  }
  return out;
}

// the analytic gradient in double: d gate = dout up silu'(g), d up = dout silu(g)
std::vector<double> swiglu_backward_reference(const std::vector<double>& inp, const std::vector<double>& dout, int rows,
                                              int width) {
  std::vector<double> dinp(inp.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      const std::size_t gate = static_cast<std::size_t>(r) * 2 * width + c, up = gate + width;
      const double g = inp[gate], sig = sigmoid_reference(g), dy = dout[static_cast<std::size_t>(r) * width + c];
      dinp[gate] = dy * inp[up] * sig * (1.0 + g * (1.0 - sig));
      dinp[up] = dy * g * sig;
    }
  }
  return dinp;
}

TEST(CpuSwiGlu, ForwardMatchesDoubleReference) {
  const int rows = 7, width = 37;  // not a multiple of a vector's lanes
  const auto inp = random_vector(rows * 2 * width, 1, -8.0f, 8.0f);
  std::vector<float> out(rows * width);
  swiglu_forward(out.data(), inp.data(), rows, width);
  EXPECT_TRUE(all_close(out, swiglu_reference(to_double(inp), rows, width), 1e-6, 1e-6));
  // known values: silu(0) = 0; silu(g) -> g for large g; the gate is the FIRST half of the row, up the second
  const std::vector<float> row = {0.0f, 20.0f, 1.0f, 3.0f, 0.5f, 2.0f};  // gates 0, 20, 1; ups 3, 0.5, 2
  std::vector<float> known(3);
  swiglu_forward(known.data(), row.data(), 1, 3);
  EXPECT_EQ(known[0], 0.0f);
  EXPECT_FLOAT_EQ(known[1], 10.0f);
  EXPECT_FLOAT_EQ(known[2], static_cast<float>(2.0 / (1.0 + std::exp(-1.0))));
}

TEST(CpuSwiGlu, BackwardMatchesFiniteDifferencesAndOverwrites) {
  const int rows = 4, width = 19;
  const auto inp = random_vector(rows * 2 * width, 11, -5.0f, 5.0f);
  const auto dout = random_vector(rows * width, 12);
  std::vector<float> dinp(inp.size(), std::numeric_limits<float>::quiet_NaN());  // overwritten, not accumulated
  swiglu_backward(dinp.data(), inp.data(), dout.data(), rows, width);
  const auto want = numeric_gradient(
      [&](const std::vector<double>& v) { return weighted_sum(swiglu_reference(v, rows, width), dout); },
      to_double(inp));
  EXPECT_TRUE(all_close(dinp, want, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dinp, swiglu_backward_reference(to_double(inp), to_double(dout), rows, width), 1e-6, 1e-5));
  // what dinp held before does not matter
  std::vector<float> dinp_from_other(inp.size(), 7.0f);
  swiglu_backward(dinp_from_other.data(), inp.data(), dout.data(), rows, width);
  EXPECT_TRUE(testing::same_bits(dinp_from_other, dinp));
}

TEST(CpuSwiGlu, LargeGatesAreFinite) {
  // the sigmoid's tails: e^-g overflows fp32 beyond g = -88.7, and e^g leaves its normal range below g = -87
  const std::vector<float> gates = {80.0f,  -80.0f,  86.0f, -86.0f, 87.5f, -87.5f, 88.8f, -88.8f,
                                    100.0f, -100.0f, 1e4f,  -1e4f,  1e30f, -1e30f, 0.0f,  -0.0f};
  const int width = static_cast<int>(gates.size());
  std::vector<float> inp(gates);
  const auto ups = random_vector(gates.size(), 21, 0.5f, 2.0f);
  inp.insert(inp.end(), ups.begin(), ups.end());
  const auto dout = random_vector(gates.size(), 22, 0.5f, 2.0f);
  std::vector<float> out(gates.size()), dinp(inp.size());
  swiglu_forward(out.data(), inp.data(), 1, width);
  swiglu_backward(dinp.data(), inp.data(), dout.data(), 1, width);
  for (int c = 0; c < width; ++c) {
    EXPECT_TRUE(std::isfinite(out[c])) << "gate " << gates[c] << ": " << out[c];
    EXPECT_TRUE(std::isfinite(dinp[c])) << "d gate at " << gates[c] << ": " << dinp[c];
    EXPECT_TRUE(std::isfinite(dinp[width + c])) << "d up at " << gates[c] << ": " << dinp[width + c];
  }
  // far out the sigmoid is exactly 1 or 0 in fp32: silu(g) = g, silu(-g) = 0, silu'(g) = 1, silu'(-g) = 0
  for (int c : {10, 12}) {  // gates 1e4 and 1e30, then their negatives
    EXPECT_EQ(out[c], gates[c] * ups[c]);
    EXPECT_EQ(out[c + 1], 0.0f);
    EXPECT_EQ(dinp[c], dout[c] * ups[c]);
    EXPECT_EQ(dinp[c + 1], 0.0f);
    EXPECT_EQ(dinp[width + c], dout[c] * gates[c]);
    EXPECT_EQ(dinp[width + c + 1], 0.0f);
  }
  // against the double formula: relatively, down to g = -87 (the tiny sigmoid of -86, e^-86 = 4e-38, keeps its
  // digits, which 1 - 1 / (1 + e^-g) would have lost from g = -17 on); below it, within 1e-35 of the true values
  // (themselves below 1e-35: fp32 leaves its normal range there)
  const std::vector<double> want_out = swiglu_reference(to_double(inp), 1, width);
  const std::vector<double> want_dinp = swiglu_backward_reference(to_double(inp), to_double(dout), 1, width);
  for (int c = 0; c < width; ++c) {
    const bool normal = gates[c] >= -87.0f;
    const auto tolerance = [&](double rtol, double want) { return normal ? rtol * std::abs(want) : 1e-35; };
    EXPECT_NEAR(out[c], want_out[c], tolerance(1e-6, want_out[c])) << "gate " << gates[c];
    EXPECT_NEAR(dinp[c], want_dinp[c], tolerance(1e-5, want_dinp[c])) << "d gate at " << gates[c];
    EXPECT_NEAR(dinp[width + c], want_dinp[width + c], tolerance(1e-6, want_dinp[width + c])) << "d up at " << gates[c];
  }
}

TEST(CpuSwiGlu, NanStaysNan) {
  const std::vector<float> inp = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  const std::vector<float> dout = {1.0f};
  std::vector<float> out(1), dinp(2);
  swiglu_forward(out.data(), inp.data(), 1, 1);
  swiglu_backward(dinp.data(), inp.data(), dout.data(), 1, 1);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(dinp[0]));
  EXPECT_TRUE(std::isnan(dinp[1]));
}

TEST(CpuSwiGlu, IsDeterministicAndRowsAreIndependent) {
  const int rows = 6, width = 24;
  const auto inp = random_vector(rows * 2 * width, 31, -6.0f, 6.0f);
  const auto dout = random_vector(rows * width, 32);
  std::vector<float> out(rows * width), dinp(inp.size());
  swiglu_forward(out.data(), inp.data(), rows, width);
  swiglu_backward(dinp.data(), inp.data(), dout.data(), rows, width);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> out1(width), dinp1(2 * width);
    swiglu_forward(out1.data(), inp.data() + r * 2 * width, 1, width);
    swiglu_backward(dinp1.data(), inp.data() + r * 2 * width, dout.data() + r * width, 1, width);
    EXPECT_TRUE(testing::same_bits(out1, {out.begin() + r * width, out.begin() + (r + 1) * width}));
    EXPECT_TRUE(testing::same_bits(dinp1, {dinp.begin() + r * 2 * width, dinp.begin() + (r + 1) * 2 * width}));
  }
}

TEST(CpuSwiGlu, RejectsBadArguments) {
  std::vector<float> inp(8, 1.0f), out(4), dout(4, 1.0f), dinp(8);
  EXPECT_THROW(swiglu_forward(inp.data(), inp.data(), 2, 2), std::invalid_argument);
  EXPECT_THROW(swiglu_forward(out.data(), inp.data(), 2, 0), std::invalid_argument);
  EXPECT_THROW(swiglu_backward(inp.data(), inp.data(), dout.data(), 2, 2), std::invalid_argument);
  EXPECT_THROW(swiglu_backward(dout.data(), inp.data(), dout.data(), 2, 2), std::invalid_argument);
  EXPECT_THROW(swiglu_backward(dinp.data(), inp.data(), nullptr, 2, 2), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

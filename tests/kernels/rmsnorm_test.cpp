// rmsnorm_forward / rmsnorm_backward against a double reference and central finite differences.
#include "kernels/cpu/rmsnorm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

struct RmsNormReference {
  std::vector<double> out, rstd;
};

// out = x / sqrt(mean(x^2) + eps) * weight, row by row, in double
RmsNormReference rmsnorm_reference(const std::vector<double>& inp, const std::vector<double>& weight, int rows,
                                   int channels) {
  RmsNormReference ref{std::vector<double>(inp.size()), std::vector<double>(rows)};
  for (int r = 0; r < rows; ++r) {
    double mean_square = 0.0;
    for (int c = 0; c < channels; ++c) mean_square += inp[r * channels + c] * inp[r * channels + c];
    mean_square /= channels;
    const double rstd = 1.0 / std::sqrt(mean_square + kRmsNormEps);
    for (int c = 0; c < channels; ++c) ref.out[r * channels + c] = inp[r * channels + c] * rstd * weight[c];
    ref.rstd[r] = rstd;
  }
  return ref;
}

TEST(CpuRmsNorm, ForwardMatchesDoubleReference) {
  const int rows = 9, channels = 53;  // not a multiple of the 8 summation lanes
  const auto inp = random_vector(rows * channels, 1, -2.0f, 3.0f);
  const auto weight = random_vector(channels, 2);
  std::vector<float> out(rows * channels), rstd(rows);
  rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), rows, channels);
  const auto ref = rmsnorm_reference(to_double(inp), to_double(weight), rows, channels);
  EXPECT_TRUE(all_close(out, ref.out, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(rstd, ref.rstd, 1e-6, 1e-5));
}

TEST(CpuRmsNorm, UnitWeightGivesUnitMeanSquareAndIgnoresScale) {
  // with weight 1 each output row has mean square mean(x^2) / (mean(x^2) + eps), ~1 for rows far above eps; and a row
  // scaled by 8 (exact in fp32) normalizes to nearly the same output: no mean is subtracted, only the scale divided out
  const int rows = 4, channels = 64;
  const auto inp = random_vector(rows * channels, 3, -1.0f, 1.0f);
  std::vector<float> scaled(inp);
  for (float& x : scaled) x *= 8.0f;
  const std::vector<float> ones(channels, 1.0f);
  std::vector<float> out(rows * channels), out_scaled(rows * channels), rstd(rows), rstd_scaled(rows);
  rmsnorm_forward(out.data(), rstd.data(), inp.data(), ones.data(), rows, channels);
  rmsnorm_forward(out_scaled.data(), rstd_scaled.data(), scaled.data(), ones.data(), rows, channels);
  for (int r = 0; r < rows; ++r) {
    double mean_square = 0.0;
    for (int c = 0; c < channels; ++c)
      mean_square += static_cast<double>(out[r * channels + c]) * out[r * channels + c];
    EXPECT_NEAR(mean_square / channels, 1.0, 1e-4) << "row " << r;
  }
  EXPECT_TRUE(all_close(out_scaled, out, 1e-4, 1e-4));
  // the mean is not subtracted: a constant row normalizes to +-1, not 0 (LayerNorm's would be 0)
  const std::vector<float> constant(channels, 0.5f);
  std::vector<float> out_constant(channels);
  rmsnorm_forward(out_constant.data(), rstd.data(), constant.data(), ones.data(), 1, channels);
  for (int c = 0; c < channels; ++c) EXPECT_NEAR(out_constant[c], 1.0f, 1e-4f) << "channel " << c;
}

TEST(CpuRmsNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int rows = 5, channels = 12;
  const auto inp = random_vector(rows * channels, 11, -1.0f, 2.0f);
  const auto weight = random_vector(channels, 12);
  const auto dout = random_vector(rows * channels, 14);
  std::vector<float> out(rows * channels), rstd(rows);
  rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), rows, channels);

  // both gradients accumulate onto what they hold (dinp: the residual path's gradient)
  const auto dinp_before = random_vector(rows * channels, 15);
  const auto dweight_before = random_vector(channels, 16);
  auto dinp = dinp_before, dweight = dweight_before;
  rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), rows, channels);

  const auto x = to_double(inp), w = to_double(weight);
  auto dx = numeric_gradient(
      [&](const std::vector<double>& v) { return weighted_sum(rmsnorm_reference(v, w, rows, channels).out, dout); }, x);
  auto dw = numeric_gradient(
      [&](const std::vector<double>& v) { return weighted_sum(rmsnorm_reference(x, v, rows, channels).out, dout); }, w);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dinp_before[i];
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] += dweight_before[i];
  EXPECT_TRUE(all_close(dinp, dx, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dweight, dw, 1e-5, 1e-4));
}

TEST(CpuRmsNorm, BackwardTwiceAccumulatesTwice) {
  // from zero, two calls give twice one call's gradients (to rounding): += rather than =
  const int rows = 3, channels = 20;
  const auto inp = random_vector(rows * channels, 21);
  const auto weight = random_vector(channels, 22);
  const auto dout = random_vector(rows * channels, 23);
  std::vector<float> out(rows * channels), rstd(rows);
  rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), rows, channels);
  std::vector<float> dinp_once(rows * channels, 0.0f), dweight_once(channels, 0.0f);
  rmsnorm_backward(dinp_once.data(), dweight_once.data(), dout.data(), inp.data(), weight.data(), rstd.data(), rows,
                   channels);
  auto dinp_twice = dinp_once, dweight_twice = dweight_once;
  rmsnorm_backward(dinp_twice.data(), dweight_twice.data(), dout.data(), inp.data(), weight.data(), rstd.data(), rows,
                   channels);
  for (float& g : dinp_once) g *= 2.0f;
  for (float& g : dweight_once) g *= 2.0f;
  EXPECT_TRUE(testing::same_bits(dinp_twice, dinp_once));           // one term per element: x + x == 2 x exactly
  EXPECT_TRUE(all_close(dweight_twice, dweight_once, 1e-6, 1e-6));  // a sum over rows: rounded in another order
}

TEST(CpuRmsNorm, IsDeterministic) {
  const int rows = 16, channels = 64;
  const auto inp = random_vector(rows * channels, 31);
  const auto weight = random_vector(channels, 32);
  const auto dout = random_vector(rows * channels, 33);
  std::vector<float> results[2];
  for (auto& result : results) {
    std::vector<float> out(rows * channels), rstd(rows), dinp(rows * channels, 0.0f), dweight(channels, 0.0f);
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), rows, channels);
    rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), rows, channels);
    for (const auto* part : {&out, &rstd, &dinp, &dweight}) result.insert(result.end(), part->begin(), part->end());
  }
  EXPECT_TRUE(testing::same_bits(results[0], results[1]));
}

TEST(CpuRmsNorm, RejectsBadArguments) {
  std::vector<float> x(8, 1.0f), w(4, 1.0f), rstd(2), dout(8, 1.0f), dw(4, 0.0f);
  try {
    rmsnorm_forward(x.data(), rstd.data(), x.data(), w.data(), 2, 4);  // out aliases inp
    ADD_FAILURE() << "an aliased output was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("twin::kernels::cpu::rmsnorm_forward: precondition failed: out != inp"),
              std::string::npos)
        << error.what();
  }
  std::vector<float> out(8);
  EXPECT_THROW(rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 0, 4), std::invalid_argument);
  EXPECT_THROW(rmsnorm_backward(dout.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), 2, 4),
               std::invalid_argument);  // dinp aliases dout
  EXPECT_THROW(rmsnorm_backward(x.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), 2, 4),
               std::invalid_argument);  // dinp aliases inp
}

}  // namespace
}  // namespace twin::kernels::cpu

// layernorm_forward / layernorm_backward against a double reference and central finite differences.
#include "kernels/cpu/layernorm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::numeric_gradient;
using testing::random_vector;
using testing::to_double;
using testing::weighted_sum;

struct LayerNormReference {
  std::vector<double> out, mean, rstd;
};

LayerNormReference layernorm_reference(const std::vector<double>& inp, const std::vector<double>& weight,
                                       const std::vector<double>& bias, int rows, int channels) {
  LayerNormReference ref{std::vector<double>(inp.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (int r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < channels; ++c) mean += inp[r * channels + c];
    mean /= channels;
    for (int c = 0; c < channels; ++c) var += (inp[r * channels + c] - mean) * (inp[r * channels + c] - mean);
    var /= channels;
    const double rstd = 1.0 / std::sqrt(var + kLayerNormEps);
    for (int c = 0; c < channels; ++c) {
      ref.out[r * channels + c] = (inp[r * channels + c] - mean) * rstd * weight[c] + bias[c];
    }
    ref.mean[r] = mean;
    ref.rstd[r] = rstd;
  }
  return ref;
}

TEST(CpuLayerNorm, ForwardMatchesDoubleReference) {
  const int rows = 9, channels = 48;
  const auto inp = random_vector(rows * channels, 1, -2.0f, 3.0f);  // off-centre rows
  const auto weight = random_vector(channels, 2);
  const auto bias = random_vector(channels, 3);
  std::vector<float> out(rows * channels), mean(rows), rstd(rows);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), rows, channels);
  const auto ref = layernorm_reference(to_double(inp), to_double(weight), to_double(bias), rows, channels);
  EXPECT_TRUE(all_close(out, ref.out, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(mean, ref.mean, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(rstd, ref.rstd, 1e-6, 1e-5));
}

TEST(CpuLayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int rows = 5, channels = 12;
  const auto inp = random_vector(rows * channels, 11, -1.0f, 2.0f);
  const auto weight = random_vector(channels, 12);
  const auto bias = random_vector(channels, 13);
  const auto dout = random_vector(rows * channels, 14);
  std::vector<float> out(rows * channels), mean(rows), rstd(rows);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), rows, channels);

  // all three gradients accumulate onto what they hold (dinp: the residual path's gradient)
  const auto dinp_before = random_vector(rows * channels, 15);
  const auto dweight_before = random_vector(channels, 16);
  const auto dbias_before = random_vector(channels, 17);
  auto dinp = dinp_before, dweight = dweight_before, dbias = dbias_before;
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                     rstd.data(), rows, channels);

  const auto x = to_double(inp), w = to_double(weight), b = to_double(bias);
  auto dx = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(layernorm_reference(v, w, b, rows, channels).out, dout);
      },
      x);
  auto dw = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(layernorm_reference(x, v, b, rows, channels).out, dout);
      },
      w);
  auto db = numeric_gradient(
      [&](const std::vector<double>& v) {
        return weighted_sum(layernorm_reference(x, w, v, rows, channels).out, dout);
      },
      b);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dinp_before[i];
  for (std::size_t i = 0; i < dw.size(); ++i) dw[i] += dweight_before[i];
  for (std::size_t i = 0; i < db.size(); ++i) db[i] += dbias_before[i];
  EXPECT_TRUE(all_close(dinp, dx, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dweight, dw, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dbias, db, 1e-5, 1e-4));
}

TEST(CpuLayerNorm, IsDeterministic) {
  const int rows = 16, channels = 64;
  const auto inp = random_vector(rows * channels, 21);
  const auto weight = random_vector(channels, 22);
  const auto bias = random_vector(channels, 23);
  const auto dout = random_vector(rows * channels, 24);
  std::vector<float> results[2];
  for (auto& result : results) {
    std::vector<float> out(rows * channels), mean(rows), rstd(rows), dinp(rows * channels, 0.0f),
        dweight(channels, 0.0f), dbias(channels, 0.0f);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), rows, channels);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                       rstd.data(), rows, channels);
    for (const auto* part : {&out, &mean, &rstd, &dinp, &dweight, &dbias}) {
      result.insert(result.end(), part->begin(), part->end());
    }
  }
  EXPECT_TRUE(testing::same_bits(results[0], results[1]));
}

TEST(CpuLayerNorm, RejectsAliasedOutput) {
  std::vector<float> x(8, 1.0f), w(4, 1.0f), b(4, 0.0f), mean(2), rstd(2);
  EXPECT_THROW(layernorm_forward(x.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 2, 4),
               std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

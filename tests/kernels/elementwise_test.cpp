// Residual, accumulate, bias, scale, copy, fill and squared norm.
#include "kernels/cpu/elementwise.hpp"

#include <gtest/gtest.h>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::random_vector;

TEST(CpuElementwise, ResidualAndAccumulate) {
  const auto a = random_vector(50, 1), b = random_vector(50, 2);
  std::vector<float> out(50);
  residual_forward(out.data(), a.data(), b.data(), 50);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  auto in_place = a;  // out may alias an input
  residual_forward(in_place.data(), in_place.data(), b.data(), 50);
  EXPECT_TRUE(testing::same_bits(in_place, out));
  auto y = a;
  accumulate(y.data(), b.data(), 50);
  EXPECT_TRUE(testing::same_bits(y, out));
}

TEST(CpuElementwise, BiasAddAndBackward) {
  const int rows = 7, channels = 5;
  const auto x = random_vector(rows * channels, 3), bias = random_vector(channels, 4);
  auto out = x;
  bias_add(out.data(), bias.data(), rows, channels);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < channels; ++c) EXPECT_EQ(out[r * channels + c], x[r * channels + c] + bias[c]);
  const auto dbias_before = random_vector(channels, 5);
  auto dbias = dbias_before;
  bias_backward(dbias.data(), x.data(), rows, channels);
  for (int c = 0; c < channels; ++c) {
    double want = dbias_before[c];
    for (int r = 0; r < rows; ++r) want += x[r * channels + c];
    EXPECT_NEAR(dbias[c], want, 1e-6);
  }
}

TEST(CpuElementwise, ScaleCopyFill) {
  auto x = random_vector(33, 6);
  const auto original = x;
  scale(x.data(), x.size(), 0.25f);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], original[i] * 0.25f);
  std::vector<float> y(33);
  copy(y.data(), original.data(), y.size());
  EXPECT_TRUE(testing::same_bits(y, original));
  fill(y.data(), y.size(), 0.0f);
  for (float value : y) EXPECT_EQ(value, 0.0f);
  EXPECT_THROW(copy(y.data() + 1, y.data(), 10), std::invalid_argument);  // overlapping ranges
  scale(nullptr, 0, 2.0f);                                                // n = 0 is a no-op
}

TEST(CpuElementwise, SquaredNormInDouble) {
  const std::vector<float> x = {3.0f, -4.0f, 12.0f};
  EXPECT_EQ(squared_norm(x.data(), x.size()), 169.0);
  // 1e8 + 1 + 1 + 1: a float sum stays at 1e8 (its ulp there is 8); the double sum is exact
  const std::vector<float> large_then_small = {1e4f, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(squared_norm(large_then_small.data(), large_then_small.size()), 100000003.0);
  EXPECT_EQ(squared_norm(nullptr, 0), 0.0);
}

}  // namespace
}  // namespace twin::kernels::cpu

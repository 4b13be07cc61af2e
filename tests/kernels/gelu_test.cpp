// gelu_forward / gelu_backward against the double formula and central finite differences.
#include "kernels/cpu/gelu.hpp"

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

std::vector<double> gelu_reference(const std::vector<double>& x) {
  const double pi = std::acos(-1.0);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  }
  return y;
}

TEST(CpuGelu, ForwardMatchesDoubleReference) {
  const auto inp = random_vector(1000, 1, -6.0f, 6.0f);
  std::vector<float> out(inp.size());
  gelu_forward(out.data(), inp.data(), inp.size());
  EXPECT_TRUE(all_close(out, gelu_reference(to_double(inp)), 1e-6, 1e-6));
  // known values: gelu(0) = 0, gelu(x) -> x for large x, -> 0 for very negative x
  const std::vector<float> special = {0.0f, 10.0f, -10.0f};
  std::vector<float> special_out(3);
  gelu_forward(special_out.data(), special.data(), 3);
  EXPECT_EQ(special_out[0], 0.0f);
  EXPECT_FLOAT_EQ(special_out[1], 10.0f);
  EXPECT_NEAR(special_out[2], 0.0f, 1e-6f);
}

TEST(CpuGelu, ForwardInPlace) {
  auto x = random_vector(100, 2, -3.0f, 3.0f);
  std::vector<float> out(x.size());
  gelu_forward(out.data(), x.data(), x.size());
  gelu_forward(x.data(), x.data(), x.size());
  EXPECT_TRUE(testing::same_bits(x, out));
}

TEST(CpuGelu, BackwardMatchesFiniteDifferencesAndOverwrites) {
  const auto inp = random_vector(200, 11, -4.0f, 4.0f);
  const auto dout = random_vector(inp.size(), 12);
  std::vector<float> dinp(inp.size(), std::numeric_limits<float>::quiet_NaN());
  gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size());
  const auto dx = numeric_gradient([&](const std::vector<double>& v) { return weighted_sum(gelu_reference(v), dout); },
                                   to_double(inp));
  EXPECT_TRUE(all_close(dinp, dx, 1e-5, 1e-4));
  // dinp may alias dout
  auto in_place = dout;
  gelu_backward(in_place.data(), inp.data(), in_place.data(), inp.size());
  EXPECT_TRUE(testing::same_bits(in_place, dinp));
}

}  // namespace
}  // namespace twin::kernels::cpu

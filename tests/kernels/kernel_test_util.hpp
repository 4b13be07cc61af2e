// Helpers of the CPU kernel tests: seeded random tensors, float <-> double copies, central finite differences in
// double, and a closeness check that reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace twin::kernels::cpu::testing {

// n floats uniform in [low, high), from a fixed seed: every run sees the same tensors.
inline std::vector<float> random_vector(std::size_t n, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(n);
  for (float& value : values) value = distribution(generator);
  return values;
}

inline std::vector<int> random_tokens(std::size_t n, int vocab, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int> distribution(0, vocab - 1);
  std::vector<int> tokens(n);
  for (int& token : tokens) token = distribution(generator);
  return tokens;
}

inline std::vector<double> to_double(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

// sum_i weights[i] * y[i]: turns a tensor-valued function into the scalar whose gradient the backward computes
// (weights play the upstream gradient dout).
inline double weighted_sum(const std::vector<double>& y, const std::vector<float>& weights) {
  double sum = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += y[i] * weights[i];
  return sum;
}

// d loss / d x by central differences, in double: (loss(x + h e_i) - loss(x - h e_i)) / 2h for every i.
template <class Loss>
std::vector<double> numeric_gradient(Loss&& loss, std::vector<double> x, double h = 1e-6) {
  std::vector<double> gradient(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = loss(x);
    x[i] = saved - h;
    const double minus = loss(x);
    x[i] = saved;
    gradient[i] = (plus - minus) / (2.0 * h);
  }
  return gradient;
}

// Every got[i] within atol + rtol * |want[i]|; on failure names the tensor and its worst element.
template <class Got, class Want>
::testing::AssertionResult all_close(const Got& got, const Want& want, double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  double worst_ratio = 0.0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    const double ratio = error / (atol + rtol * std::abs(static_cast<double>(want[i])));
    if (!(ratio <= worst_ratio)) {  // also catches NaN
      worst_ratio = ratio;
      worst = i;
      if (std::isnan(ratio)) break;
    }
  }
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst << " of " << got.size() << ": got " << got[worst]
                                       << ", want " << want[worst] << " (error " << worst_ratio << " x tolerance, atol "
                                       << atol << ", rtol " << rtol << ")";
}

// Bitwise equality of two float vectors (determinism checks).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace twin::kernels::cpu::testing

#include "kernels/cpu/swiglu.hpp"

#include <cmath>
#include <cstddef>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/exp.hpp"

namespace twin::kernels::cpu {

namespace {

// sigmoid(g) = 1 / (1 + e^-g) for g >= 0, e^g / (1 + e^g) for g < 0: both from e = e^-|g| in [0, 1]. exp_cephes
// (exp.hpp) rather than std::exp, so that the loops vectorize; it is undefined above 88.7, and -|g| <= 0 never gets
// there, so no clamp is needed (the GELU's 1 / (1 + e^-g) clamps e^-g at e^80, which would give every gate below -80
// the sigmoid e^-80): no inf and no NaN at any |g|, and the tiny sigmoid of a very negative gate keeps its relative
// accuracy down to g = -87. Below -87 exp_cephes returns exactly 0: the sigmoid is then 1, or 0 instead of a value
// under 2e-38 (never a subnormal). A NaN stays NaN.
inline float sigmoid(float g) {
  const float e = detail::exp_cephes(-std::fabs(g));
  return (g >= 0.0f ? 1.0f : e) / (1.0f + e);
}

}  // namespace

void swiglu_forward(float* out, const float* inp, int rows, int width) {
  TWIN_KERNEL_CHECK(rows > 0 && width > 0);
  TWIN_KERNEL_CHECK(out != nullptr && inp != nullptr);
  TWIN_KERNEL_CHECK(out != inp);
  for (int r = 0; r < rows; ++r) {
    const float* gate = inp + static_cast<std::size_t>(r) * 2 * width;
    const float* up = gate + width;
    float* y = out + static_cast<std::size_t>(r) * width;
    for (int c = 0; c < width; ++c) {
      const float g = gate[c];
      y[c] = g * sigmoid(g) * up[c];
    }
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int rows, int width) {
  TWIN_KERNEL_CHECK(rows > 0 && width > 0);
  TWIN_KERNEL_CHECK(dinp != nullptr && inp != nullptr && dout != nullptr);
  TWIN_KERNEL_CHECK(dinp != inp && dinp != dout);
  for (int r = 0; r < rows; ++r) {
    const float* gate = inp + static_cast<std::size_t>(r) * 2 * width;
    const float* up = gate + width;
    const float* dy = dout + static_cast<std::size_t>(r) * width;
    float* dgate = dinp + static_cast<std::size_t>(r) * 2 * width;
    float* dup = dgate + width;
    for (int c = 0; c < width; ++c) {
      // silu'(g) = sigmoid(g) + g sigmoid(g) (1 - sigmoid(g)): sigmoid' = sigmoid (1 - sigmoid). At g = -1e4 it is
      // 0 * (1 - 1e4) = -0, at g = 1e4 it is 1 * (1 + 1e4 * 0) = 1: finite at both ends.
      const float g = gate[c];
      const float sig = sigmoid(g);
      const float silu_grad = sig * (1.0f + g * (1.0f - sig));
      dgate[c] = dy[c] * up[c] * silu_grad;
      dup[c] = dy[c] * (g * sig);
    }
  }
}

}  // namespace twin::kernels::cpu

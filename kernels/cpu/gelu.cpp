#include "kernels/cpu/gelu.hpp"

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/exp.hpp"

namespace twin::kernels::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCubic = 0.044715f;

// 0.5 (1 + tanh u) = sigmoid(2 u) = 1 / (1 + exp(-2 u)): one exponential instead of a tanh, and no cancellation in
// 1 + tanh u for very negative u. exp_cephes (exp.hpp) rather than std::exp, so that the loops below vectorize; its
// argument is kept at or below 80, where 1 + e^80 still has a normal reciprocal (a subnormal costs a microcode assist
// per lane) and the sigmoid is 0 to float precision anyway; a NaN stays NaN.
inline float half_one_plus_tanh(float u) {
  const float a = -2.0f * u;
  return 1.0f / (1.0f + detail::exp_cephes(a > 80.0f ? 80.0f : a));
}
}  // namespace

void gelu_forward(float* out, const float* inp, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (out != nullptr && inp != nullptr));
  // Element i reads only inp[i]: no dependence across elements even in place (out == inp), so the loop vectorizes
  // whatever the pointers (GCC would otherwise take its scalar copy when they overlap).
#pragma GCC ivdep
  for (std::size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = x * half_one_plus_tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (dinp != nullptr && inp != nullptr && dout != nullptr));
#pragma GCC ivdep  // as above: dinp may alias dout, element by element
  for (std::size_t i = 0; i < n; ++i) {
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx,  u = sqrt(2/pi) (x + 0.044715 x^3)
    // with h = 0.5 (1 + tanh u): 0.5 sech^2(u) = 0.5 (1 - tanh u)(1 + tanh u) = 2 h (1 - h)
    const float x = inp[i];
    const float h = half_one_plus_tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float local_grad = h + 2.0f * x * h * (1.0f - h) * du_dx;
    dinp[i] = local_grad * dout[i];
  }
}

}  // namespace twin::kernels::cpu

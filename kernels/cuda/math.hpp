// Scalar formulas shared by the CUDA kernels and the host (plain C++ when g++ compiles it): GELU and its derivative,
// and one AdamW element. The tests run these on the CPU against kernels/cpu (tests/kernels_cuda/math_test.cpp), so
// the device kernels compute the CPU twin's formulas, operation for operation.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TWIN_HOST_DEVICE __host__ __device__
#else
#define TWIN_HOST_DEVICE
#endif

namespace twin::kernels::cuda::math {

// --- correctly rounded fp32 operations that nvcc may not contract into an FMA
// ----------------------------------------- The CPU twin is compiled without FMA contraction (ISO C++ mode, no -march):
// using these where bits matter (AdamW) gives the device the host's bits.
TWIN_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TWIN_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TWIN_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TWIN_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TWIN_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// --- GELU, tanh approximation (kernels/cpu/gelu.hpp) ---------------------------------------------------------------
//   gelu(x) = x h(x),  h(x) = 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = h + 2 x h (1 - h) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

// e^x as kernels/cpu/gelu.cpp computes it, operation for operation: the Cephes polynomial of e^r after x = k ln 2 + r,
// 2^k in the exponent bits, x clamped to [-80, 80] (a NaN to -80). Why a polynomial rather than expf: see there.
TWIN_HOST_DEVICE inline float gelu_exp(float x) {
  x = x > -80.0f ? x : -80.0f;
  x = x < 80.0f ? x : 80.0f;
  const float t = x * 1.44269504088896341f;
  int k = static_cast<int>(t);
  k -= t < static_cast<float>(k) ? 1 : 0;
  const float kf = static_cast<float>(k);
  const float r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * r * r + r + 1.0f;
#if defined(__CUDA_ARCH__)
  return e_r * __int_as_float((k + 127) << 23);
#else
  const std::int32_t bits = (k + 127) << 23;  // (C++17 here: no std::bit_cast)
  float scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  return e_r * scale;
#endif
}

TWIN_HOST_DEVICE inline float gelu_half_one_plus_tanh(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 1.0f / (1.0f + gelu_exp(-2.0f * u));
}

TWIN_HOST_DEVICE inline float gelu(float x) {
  return x * gelu_half_one_plus_tanh(x);
}

TWIN_HOST_DEVICE inline float gelu_grad(float x) {
  const float h = gelu_half_one_plus_tanh(x);
  const float du_dx = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return h + 2.0f * x * h * (1.0f - h) * du_dx;
}

// --- AdamW (kernels/cpu/adamw.hpp): the per-step constants in double on the host, then one element
// ---------------------
struct AdamWConstants {
  float beta1 = 0, beta2 = 0, eps = 0, grad_scale = 1;
  float step_size = 0;              // lr / (1 - beta1^step)
  float sqrt_bias_correction2 = 0;  // sqrt(1 - beta2^step)
  float decay = 1;                  // 1 - lr * weight_decay
};

inline AdamWConstants adamw_constants(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                                      float grad_scale) {
  AdamWConstants k;
  k.beta1 = beta1;
  k.beta2 = beta2;
  k.eps = eps;
  k.grad_scale = grad_scale;
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  k.step_size = static_cast<float>(lr / bias_correction1);
  k.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  k.decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  return k;
}

// param, m, v updated in place from grad, in the CPU twin's order of operations, each correctly rounded
TWIN_HOST_DEVICE inline void adamw_element(float& param, float grad, float& m, float& v, const AdamWConstants& k) {
  const float g = mul_rn(grad, k.grad_scale);
  const float m_new = add_rn(mul_rn(k.beta1, m), mul_rn(sub_rn(1.0f, k.beta1), g));
  const float v_new = add_rn(mul_rn(k.beta2, v), mul_rn(mul_rn(sub_rn(1.0f, k.beta2), g), g));
  m = m_new;
  v = v_new;
  const float denom = add_rn(div_rn(sqrt_rn(v_new), k.sqrt_bias_correction2), k.eps);
  const float decayed = mul_rn(param, k.decay);
  param = sub_rn(decayed, mul_rn(k.step_size, div_rn(m_new, denom)));
}

}  // namespace twin::kernels::cuda::math

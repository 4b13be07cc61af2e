// Scalar formulas shared by the CUDA kernels and the host (plain C++ when g++ compiles it): GELU and its derivative,
// SwiGLU and its derivatives, the rotary embeddings' angles and rotation, and one AdamW element. The tests run these
// on the CPU against kernels/cpu (tests/kernels_cuda/host_test.cpp), so the device kernels compute the CPU twin's
// formulas, operation for operation.
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

// A float's bits and back, on either side (the host compiles this as C++17: no std::bit_cast).
TWIN_HOST_DEVICE inline std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}
TWIN_HOST_DEVICE inline float float_of(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// e^a as kernels/cpu/exp.hpp computes it (Cephes' expf, branch-free; see there), operation for operation.
TWIN_HOST_DEVICE inline float exp_cephes(float a) {
  const float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float kRound = 12582912.0f;
  const std::uint32_t kMinus87 = 0xC2AE0000u;   // -87.0f
  const std::uint32_t kMinusInf = 0xFF800000u;  // -inf
  const std::uint32_t bits = bits_of(a);
  const std::uint32_t below = 0u - static_cast<std::uint32_t>((bits > kMinus87) & (bits <= kMinusInf));
  const float clamped = float_of((bits & ~below) | (kMinus87 & below));
  const float k_plus = clamped * kLog2e + kRound;
  const float k = k_plus - kRound;
  const float r = (clamped - k * kLn2Hi) - k * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float exp_r = poly * (r * r) + r + 1.0f;
  const std::uint32_t k_int = bits_of(k_plus) - bits_of(kRound);
  const float two_k = float_of((k_int + 127u) << 23);
  return float_of(bits_of(exp_r * two_k) & ~below);
}

TWIN_HOST_DEVICE inline float gelu_half_one_plus_tanh(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float a = -2.0f * u;
  return 1.0f / (1.0f + exp_cephes(a > 80.0f ? 80.0f : a));  // as kernels/cpu/gelu.cpp: at most 80
}

TWIN_HOST_DEVICE inline float gelu(float x) {
  return x * gelu_half_one_plus_tanh(x);
}

TWIN_HOST_DEVICE inline float gelu_grad(float x) {
  const float h = gelu_half_one_plus_tanh(x);
  const float du_dx = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return h + 2.0f * x * h * (1.0f - h) * du_dx;
}

// --- SwiGLU (kernels/cpu/swiglu.hpp) --------------------------------------------------------------------------------
//   out = silu(gate) up,  silu(g) = g sigmoid(g),  sigmoid(g) = 1 / (1 + e^-g)
//   d gate = dout up silu'(gate),  silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))),   d up = dout silu(gate)
// The sigmoid as kernels/cpu/swiglu.cpp computes it, from e = e^-|g| in [0, 1] (exp_cephes above, never past its
// range): 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0; no inf or NaN at any finite g. |g| by clearing the sign bit
// (what fabs does), the same on either side.
TWIN_HOST_DEVICE inline float swiglu_sigmoid(float g) {
  const float e = exp_cephes(-float_of(bits_of(g) & 0x7fffffffu));
  return (g >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// silu(gate) * up, in the CPU twin's order: (g sigmoid(g)) up
TWIN_HOST_DEVICE inline float swiglu(float gate, float up) {
  return gate * swiglu_sigmoid(gate) * up;
}

// d gate = (dout up) silu'(gate)
TWIN_HOST_DEVICE inline float swiglu_dgate(float gate, float up, float dout) {
  const float sig = swiglu_sigmoid(gate);
  const float silu_grad = sig * (1.0f + gate * (1.0f - sig));
  return dout * up * silu_grad;
}

// d up = dout (g sigmoid(g))
TWIN_HOST_DEVICE inline float swiglu_dup(float gate, float dout) {
  return dout * (gate * swiglu_sigmoid(gate));
}

// --- rotary embeddings (kernels/cpu/rope.hpp) ------------------------------------------------------------------------
// The cos and sin of pair i at position t, as kernels/cpu/rope.cpp computes them: in double,
//   theta_i = base^(-2i/r),  angle = t theta_i,  cos = (float) cos(angle),  sin = (float) (direction sin(angle))
// (r the rotated dimensions: the head dimension, or fewer with partial rotary embeddings),
// each rounded once to fp32; direction +1 forward, -1 backward (the transpose: the same cos, -sin). The device's double
// pow, cos and sin are within 2 ulp of the host's libm: the fp32 roundings agree but in the rarest ties.
TWIN_HOST_DEVICE inline void rope_cos_sin(int t, int i, int rotary_dim, float base, double direction, float* cos_angle,
                                          float* sin_angle) {
#if defined(__CUDA_ARCH__)
  const double theta = ::pow(static_cast<double>(base), -2.0 * i / rotary_dim);
  const double angle = static_cast<double>(t) * theta;
  *cos_angle = static_cast<float>(::cos(angle));
  *sin_angle = static_cast<float>(direction * ::sin(angle));
#else
  const double theta = std::pow(static_cast<double>(base), -2.0 * i / rotary_dim);
  const double angle = static_cast<double>(t) * theta;
  *cos_angle = static_cast<float>(std::cos(angle));
  *sin_angle = static_cast<float>(direction * std::sin(angle));
#endif
}

// The rotation of one pair (x1, x2) = (x[i], x[i + d/2]) in place, in the CPU twin's fp32 operations, each correctly
// rounded (no FMA contraction on the device):
//   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin
TWIN_HOST_DEVICE inline void rope_rotate(float& x1, float& x2, float cos_angle, float sin_angle) {
  const float x1_i = x1, x2_i = x2;
  x1 = sub_rn(mul_rn(x1_i, cos_angle), mul_rn(x2_i, sin_angle));
  x2 = add_rn(mul_rn(x2_i, cos_angle), mul_rn(x1_i, sin_angle));
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

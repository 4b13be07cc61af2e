#include "kernels/cpu/adamw.hpp"

#include <cmath>

#include "kernels/cpu/check.hpp"

namespace twin::kernels::cpu {

void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, float grad_scale) {
  TWIN_KERNEL_CHECK(n == 0 || (param != nullptr && grad != nullptr && m != nullptr && v != nullptr));
  TWIN_KERNEL_CHECK(step >= 1);
  TWIN_KERNEL_CHECK(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f);
  TWIN_KERNEL_CHECK(lr >= 0.0f && eps >= 0.0f && weight_decay >= 0.0f);
  // bias corrections in double (PyTorch computes them in Python floats), then rounded once
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    const float denom = std::sqrt(v_i) / sqrt_bias_correction2 + eps;  // the order of PyTorch's operations
    const float decayed = param[i] * decay;
    param[i] = decayed - step_size * (m_i / denom);
  }
}

}  // namespace twin::kernels::cpu

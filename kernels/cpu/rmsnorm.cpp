#include "kernels/cpu/rmsnorm.hpp"

#include <cmath>
#include <cstddef>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int rows, int channels) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0);
  TWIN_KERNEL_CHECK(out != nullptr && rstd != nullptr && inp != nullptr && weight != nullptr);
  TWIN_KERNEL_CHECK(out != inp);
  for (int r = 0; r < rows; ++r) {
    const float* x = inp + static_cast<std::size_t>(r) * channels;
    float* y = out + static_cast<std::size_t>(r) * channels;
    // a sum of squares has no cancellation: one pass, in 8 float lanes as layernorm_forward's variance
    const std::size_t n = static_cast<std::size_t>(channels);
    const float sum_squares = detail::dot(x, x, n);
    const float s = 1.0f / std::sqrt(sum_squares / static_cast<float>(channels) + kRmsNormEps);
    for (int c = 0; c < channels; ++c) y[c] = x[c] * s * weight[c];
    rstd[r] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int rows, int channels) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0);
  TWIN_KERNEL_CHECK(dinp != nullptr && dweight != nullptr);
  TWIN_KERNEL_CHECK(dout != nullptr && inp != nullptr && weight != nullptr && rstd != nullptr);
  TWIN_KERNEL_CHECK(dinp != dout && dinp != inp);
  const float inv_channels = 1.0f / static_cast<float>(channels);
  for (int r = 0; r < rows; ++r) {
    const float* x = inp + static_cast<std::size_t>(r) * channels;
    const float* dy = dout + static_cast<std::size_t>(r) * channels;
    float* dx = dinp + static_cast<std::size_t>(r) * channels;
    const float s = rstd[r];
    // norm = x s,  dnorm = dy * weight,  d s / d x_j = -s^3 x_j / channels, so
    // dx = s * dnorm + sum_c dnorm_c x_c (-s^3 x / channels) = s * (dnorm - norm * mean(dnorm * norm))
    // (LayerNorm's formula without its mean(dnorm) term: no mean was subtracted)
    const std::size_t n = static_cast<std::size_t>(channels);
    const float dnorm_norm_mean =
        inv_channels * detail::lane_sum<float>(n, [&](std::size_t c) { return dy[c] * weight[c] * (x[c] * s); });
    for (int c = 0; c < channels; ++c) {
      const float norm = x[c] * s;
      const float dnorm = dy[c] * weight[c];
      dweight[c] += norm * dy[c];
      dx[c] += (dnorm - norm * dnorm_norm_mean) * s;
    }
  }
}

}  // namespace twin::kernels::cpu

#include "kernels/cpu/layernorm.hpp"

#include <cmath>
#include <cstddef>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int rows, int channels) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0);
  TWIN_KERNEL_CHECK(out != nullptr && mean != nullptr && rstd != nullptr);
  TWIN_KERNEL_CHECK(inp != nullptr && weight != nullptr && bias != nullptr);
  TWIN_KERNEL_CHECK(out != inp);
  for (int r = 0; r < rows; ++r) {
    const float* x = inp + static_cast<std::size_t>(r) * channels;
    float* y = out + static_cast<std::size_t>(r) * channels;
    // two passes (mean, then variance around it): no cancellation for rows far from zero
    const std::size_t n = static_cast<std::size_t>(channels);
    const float m = detail::sum(x, n) / static_cast<float>(channels);
    const float sum_squares = detail::lane_sum<float>(n, [&](std::size_t c) { return (x[c] - m) * (x[c] - m); });
    const float s = 1.0f / std::sqrt(sum_squares / static_cast<float>(channels) + kLayerNormEps);
    for (int c = 0; c < channels; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int rows, int channels) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0);
  TWIN_KERNEL_CHECK(dinp != nullptr && dweight != nullptr && dbias != nullptr);
  TWIN_KERNEL_CHECK(dout != nullptr && inp != nullptr && weight != nullptr && mean != nullptr && rstd != nullptr);
  TWIN_KERNEL_CHECK(dinp != dout && dinp != inp);
  const float inv_channels = 1.0f / static_cast<float>(channels);
  for (int r = 0; r < rows; ++r) {
    const float* x = inp + static_cast<std::size_t>(r) * channels;
    const float* dy = dout + static_cast<std::size_t>(r) * channels;
    float* dx = dinp + static_cast<std::size_t>(r) * channels;
    const float m = mean[r];
    const float s = rstd[r];
    // norm = (x - m) * s,  dnorm = dy * weight
    // dx += s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    const std::size_t n = static_cast<std::size_t>(channels);
    const float dnorm_mean = inv_channels * detail::dot(dy, weight, n);
    const float dnorm_norm_mean =
        inv_channels * detail::lane_sum<float>(n, [&](std::size_t c) { return dy[c] * weight[c] * ((x[c] - m) * s); });
    for (int c = 0; c < channels; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = dy[c] * weight[c];
      dbias[c] += dy[c];
      dweight[c] += norm * dy[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

}  // namespace twin::kernels::cpu

#include "kernels/cpu/elementwise.hpp"

#include <algorithm>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/reduce.hpp"

namespace twin::kernels::cpu {

void residual_forward(float* out, const float* a, const float* b, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (out != nullptr && a != nullptr && b != nullptr));
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate(float* y, const float* x, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (y != nullptr && x != nullptr));
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

void bias_add(float* out, const float* bias, int rows, int channels) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0);
  TWIN_KERNEL_CHECK(out != nullptr && bias != nullptr);
  for (int r = 0; r < rows; ++r) {
    float* y = out + static_cast<std::size_t>(r) * channels;
    for (int c = 0; c < channels; ++c) y[c] += bias[c];
  }
}

void bias_backward(float* dbias, const float* dout, int rows, int channels) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0);
  TWIN_KERNEL_CHECK(dbias != nullptr && dout != nullptr);
  for (int r = 0; r < rows; ++r) {
    const float* dy = dout + static_cast<std::size_t>(r) * channels;
    for (int c = 0; c < channels; ++c) dbias[c] += dy[c];
  }
}

void scale(float* x, std::size_t n, float factor) {
  TWIN_KERNEL_CHECK(n == 0 || x != nullptr);
  for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
}

void copy(float* out, const float* inp, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (out != nullptr && inp != nullptr));
  TWIN_KERNEL_CHECK(n == 0 || out + n <= inp || inp + n <= out);
  std::copy(inp, inp + n, out);
}

void fill(float* x, std::size_t n, float value) {
  TWIN_KERNEL_CHECK(n == 0 || x != nullptr);
  std::fill(x, x + n, value);
}

double squared_norm(const float* x, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || x != nullptr);
  return detail::lane_sum<double>(n, [&](std::size_t i) { return static_cast<double>(x[i]) * x[i]; });
}

}  // namespace twin::kernels::cpu

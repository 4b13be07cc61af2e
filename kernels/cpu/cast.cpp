#include "kernels/cpu/cast.hpp"

#include "kernels/cpu/check.hpp"

namespace twin::kernels::cpu {

void cast_float_to_bf16(std::uint16_t* out, const float* inp, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (out != nullptr && inp != nullptr));
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bf16(inp[i]);
}

void cast_bf16_to_float(float* out, const std::uint16_t* inp, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (out != nullptr && inp != nullptr));
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(inp[i]);
}

void round_to_bf16(float* out, const float* inp, std::size_t n) {
  TWIN_KERNEL_CHECK(n == 0 || (out != nullptr && inp != nullptr));
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(float_to_bf16(inp[i]));
}

}  // namespace twin::kernels::cpu

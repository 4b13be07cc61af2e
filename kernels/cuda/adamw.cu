#include "kernels/cuda/adamw.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

// master[i], m[i], v[i] <- AdamW(master[i], grad[i], m[i], v[i]);  param[i] = bf16(master[i]) when param is given
__global__ void adamw_kernel(bf16* param, float* master, const float* grad, float* m, float* v, std::size_t n,
                             math::AdamWConstants constants) {
  TWIN_GRID_STRIDE_LOOP(i, n) {
    float p = master[i];
    float m_i = m[i];
    float v_i = v[i];
    math::adamw_element(p, grad[i], m_i, v_i, constants);
    master[i] = p;
    m[i] = m_i;
    v[i] = v_i;
    if (param != nullptr) param[i] = __float2bfloat16_rn(p);
  }
}

void check_hyper_parameters(float lr, float beta1, float beta2, float eps, float weight_decay, int step) {
  TWIN_CUDA_REQUIRE(step >= 1);
  TWIN_CUDA_REQUIRE(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f);
  TWIN_CUDA_REQUIRE(lr >= 0.0f && eps >= 0.0f && weight_decay >= 0.0f);
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, float grad_scale, cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 || (param != nullptr && grad != nullptr && m != nullptr && v != nullptr));
  check_hyper_parameters(lr, beta1, beta2, eps, weight_decay, step);
  if (n == 0) return;
  const math::AdamWConstants constants = math::adamw_constants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  adamw_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(nullptr, param, grad, m, v, n,
                                                                                          constants);
  TWIN_CUDA_CHECK_LAUNCH();
}

void adamw_update(bf16* param, float* master, const float* grad, float* m, float* v, std::size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale,
                  cudaStream_t stream) {
  TWIN_CUDA_REQUIRE(n == 0 ||
                    (param != nullptr && master != nullptr && grad != nullptr && m != nullptr && v != nullptr));
  check_hyper_parameters(lr, beta1, beta2, eps, weight_decay, step);
  if (n == 0) return;
  const math::AdamWConstants constants = math::adamw_constants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  adamw_kernel<<<launch::grid_stride_blocks(n), launch::kElementwiseThreads, 0, stream>>>(param, master, grad, m, v, n,
                                                                                          constants);
  TWIN_CUDA_CHECK_LAUNCH();
}

}  // namespace twin::kernels::cuda

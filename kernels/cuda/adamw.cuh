// AdamW on the device, twin of kernels/cpu/adamw.hpp (PyTorch's torch.optim.AdamW, non-amsgrad):
//   g = grad * grad_scale;  param *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   param -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
// The step constants are computed on the host in double as the CPU twin does, and every element with correctly
// rounded fp32 operations in the CPU twin's order (math.hpp): the same bits as kernels/cpu on the same inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace twin::kernels::cuda {

// fp32 parameters: param (n), m (n), v (n) updated in place from grad (n); step is 1-based.
void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, float grad_scale, cudaStream_t stream);

// Mixed precision: the update runs on the fp32 master copy master (n), and param (n, the bf16 working weights the
// kernels read) receives it rounded to nearest even.
void adamw_update(__nv_bfloat16* param, float* master, const float* grad, float* m, float* v, std::size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale,
                  cudaStream_t stream);

}  // namespace twin::kernels::cuda

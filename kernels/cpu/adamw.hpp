// AdamW with decoupled weight decay, bias-corrected, exactly as PyTorch torch.optim.AdamW (non-amsgrad):
//   g = grad * grad_scale                       (grad_scale: global-norm clipping factor, or 1)
//   param *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// GPT-2 practice decays only the matrices (and embeddings): pass weight_decay = 0 for biases and LayerNorm weights.
#pragma once

#include <cstddef>

namespace twin::kernels::cpu {

// param (n), m (n), v (n) updated in place from grad (n); step is 1-based (the bias corrections use it).
// m and v start at zero before step 1.
void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, float grad_scale);

}  // namespace twin::kernels::cpu

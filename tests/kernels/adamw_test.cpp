// adamw_update against a two-step reference written in double from PyTorch's AdamW formulas.
#include "kernels/cpu/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::random_vector;

struct AdamWHyper {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// torch.optim.AdamW, one step t (1-based) on one element, in double:
//   param *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   param -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
void adamw_reference_step(double& param, double& m, double& v, double g, const AdamWHyper& hyper, int t) {
  param *= 1.0 - hyper.lr * hyper.weight_decay;
  m = hyper.beta1 * m + (1.0 - hyper.beta1) * g;
  v = hyper.beta2 * v + (1.0 - hyper.beta2) * g * g;
  const double bias_correction1 = 1.0 - std::pow(hyper.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(hyper.beta2, t);
  param -= hyper.lr / bias_correction1 * m / (std::sqrt(v) / std::sqrt(bias_correction2) + hyper.eps);
}

TEST(CpuAdamW, TwoStepsMatchPyTorchFormulas) {
  const std::size_t n = 257;
  const AdamWHyper hyper;
  const float grad_scale = 0.5f;  // e.g. clipping by a global norm twice the threshold
  auto param = random_vector(n, 1);
  const auto grad1 = random_vector(n, 2, -2.0f, 2.0f);
  const auto grad2 = random_vector(n, 3, -2.0f, 2.0f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> param_ref(param.begin(), param.end()), m_ref(n, 0.0), v_ref(n, 0.0);

  int step = 1;
  for (const auto* grad : {&grad1, &grad2}) {
    adamw_update(param.data(), grad->data(), m.data(), v.data(), n, float(hyper.lr), float(hyper.beta1),
                 float(hyper.beta2), float(hyper.eps), float(hyper.weight_decay), step, grad_scale);
    for (std::size_t i = 0; i < n; ++i) {
      adamw_reference_step(param_ref[i], m_ref[i], v_ref[i], double((*grad)[i]) * grad_scale, hyper, step);
    }
    EXPECT_TRUE(all_close(m, m_ref, 1e-7, 1e-6)) << "step " << step;
    EXPECT_TRUE(all_close(v, v_ref, 1e-9, 1e-6)) << "step " << step;
    EXPECT_TRUE(all_close(param, param_ref, 1e-7, 1e-6)) << "step " << step;
    ++step;
  }
}

TEST(CpuAdamW, FirstStepMovesByLearningRate) {
  // m_hat = g and v_hat = g^2 after one step, so the update is lr * g / (|g| + eps) ~ lr sign(g)
  float param = 1.0f, grad = 0.5f, m = 0.0f, v = 0.0f;
  adamw_update(&param, &grad, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f);
  EXPECT_NEAR(param, 0.9f, 1e-6f);
  EXPECT_FLOAT_EQ(m, 0.05f);
  EXPECT_NEAR(v, 0.00025f, 1e-8f);  // (1 - 0.999f) is 0.00099998713 in float
}

TEST(CpuAdamW, DecoupledWeightDecayWithZeroGradient) {  // g = 0: only the decay acts, param *= 1 - lr wd
  float param = 2.0f, grad = 0.0f, m = 0.0f, v = 0.0f;
  adamw_update(&param, &grad, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1.0f);
  EXPECT_FLOAT_EQ(param, 2.0f * (1.0f - 0.01f * 0.1f));
}

TEST(CpuAdamW, RejectsStepZero) {
  float param = 1.0f, grad = 1.0f, m = 0.0f, v = 0.0f;
  EXPECT_THROW(adamw_update(&param, &grad, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 1.0f), std::invalid_argument);
}

}  // namespace
}  // namespace twin::kernels::cpu

// The cuda backend's FP8 (exec/cuda/cuda_backend_fp8.cpp): the sm_90 refusal's wording (any machine), its FP8 linear
// layers against the cpu backend's emulation for every recipe (any GPU: below sm_89 the per-tensor recipes take the
// quantize-dequantize path), and gpt-tiny trained in FP8 ("hybrid", delayed scaling) on the cuda backend against the
// cpu backend (sm_90+; below, the run must be refused by name).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/cuda/cuda_exec.hpp"
#include "exec/train/trainer.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "tests/exec/cuda/backend_tensors.hpp"
#include "tests/exec/exec_test_util.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels_cuda/cuda_test_util.hpp"

namespace twin::exec::cuda {
namespace {

using kernels::cpu::testing::random_vector;
using kernels::cuda::testing::bf16_rounded;
using kernels::cuda::testing::normalised_error_below;

TEST(CudaFp8Refusal, NamesTheGpuBelowSm90) {
  EXPECT_EQ(fp8_gemm_refusal(80), "model.fp8: the cuda backend's FP8 GEMMs need sm_90 or later (this GPU is sm_80)");
  EXPECT_NE(fp8_gemm_refusal(89), "");
  EXPECT_EQ(fp8_gemm_refusal(90), "");
  EXPECT_EQ(fp8_gemm_refusal(100), "");
}

using test_tensors::make;
using test_tensors::read;

struct Recipe {
  const char* name;
  Fp8Operand input, weight, gradient;
};

// One FP8 linear layer forward and backward through a backend: out, dinp, dweight, dbias, and the amaxes.
struct LayerResult {
  std::vector<float> out, dinp, dweight, dbias;
  Fp8Amaxes forward, backward;
};

LayerResult run_layer(Backend& be, const Recipe& r) {
  const int rows = 64, in_f = 64, out_f = 192;  // the test model's qkv GEMM: FP8 GEMM-sized
  const DType act = be.activation_dtype();
  const auto inp = bf16_rounded(random_vector(rows * in_f, 1, -2.0f, 2.0f));
  const auto weight = bf16_rounded(random_vector(out_f * in_f, 2, -0.2f, 0.2f));
  const auto bias = bf16_rounded(random_vector(out_f, 3));
  const auto dout = bf16_rounded(random_vector(rows * out_f, 4, -0.01f, 0.01f));
  Tensor t_inp = make(be, inp, act), t_weight = make(be, weight, act), t_bias = make(be, bias, act);
  Tensor t_out = be.allocate(rows * out_f, act), t_dinp = be.allocate(rows * in_f, act);
  Tensor t_dout = make(be, dout, act);
  Tensor t_dweight = be.zeros(out_f * in_f, DType::F32), t_dbias = be.zeros(out_f, DType::F32);
  LayerResult result;
  result.forward =
      be.fp8_kernels().fp8_matmul_forward(t_out, t_inp, t_weight, t_bias, rows, in_f, out_f, r.input, r.weight);
  result.backward = be.fp8_kernels().fp8_matmul_backward(t_dinp, t_dweight, t_dbias, t_dout, t_inp, t_weight, rows,
                                                         in_f, out_f, r.input, r.weight, r.gradient);
  result.out = read(be, t_out), result.dinp = read(be, t_dinp);
  result.dweight = read(be, t_dweight), result.dbias = read(be, t_dbias);
  return result;
}

TEST(CudaBackendFp8, LinearLayersMatchCpuBackendForEveryRecipe) {
  TWIN_REQUIRE_GPU();
  using S = Fp8Operand::Scaling;
  const std::vector<Recipe> recipes = {
      {"delayed hybrid", {false, S::PerTensor, 100.0f}, {false, S::PerTensor, 1500.0f}, {true, S::PerTensor, 4e6f}},
      {"tensorwise hybrid", {false, S::Current}, {false, S::Current}, {true, S::Current}},
      {"blockwise", {false, S::Tiles}, {false, S::Blocks}, {false, S::Tiles}},
      {"mxfp8", {false, S::Mx}, {false, S::Mx}, {true, S::Mx}}};
  for (const Recipe& recipe : recipes) {
    SCOPED_TRACE(recipe.name);
    cpu::CpuBackend host_backend;
    CudaBackend gpu_backend;
    const LayerResult want = run_layer(host_backend, recipe), got = run_layer(gpu_backend, recipe);
    EXPECT_TRUE(normalised_error_below(got.out, want.out, 1e-2)) << "out";
    EXPECT_TRUE(normalised_error_below(got.dinp, want.dinp, 1e-2)) << "dinp";
    EXPECT_TRUE(normalised_error_below(got.dweight, want.dweight, 1e-2)) << "dweight";
    EXPECT_TRUE(normalised_error_below(got.dbias, want.dbias, 1e-5)) << "dbias";
    EXPECT_EQ(got.forward.input, want.forward.input);  // amaxes of the same bf16 values: exact
    EXPECT_EQ(got.forward.weight, want.forward.weight);
    EXPECT_EQ(got.backward.gradient, want.backward.gradient);
  }
}

// gpt-tiny (scenarios/gpt-tiny.toml) in bf16 with model.fp8 = "hybrid" (delayed scaling), kSteps steps on one rank.
// Tolerance: each step's loss within kStepTolerance of the cpu backend's, the bound the bf16 runs keep
// (exec_cuda_test.cpp's CudaTraining): the cpu emulates FP8 on fp32 activations, the GPU quantizes bf16 ones.
constexpr int kSteps = 8;
constexpr double kStepTolerance = 0.02;

std::vector<double> tiny_fp8_losses(const std::string& backend) {
  const std::vector<model::Override> overrides = {model::parse_override("model.dtype=\"bf16\""),
                                                  model::parse_override("model.fp8=\"hybrid\"")};
  const model::Scenario s = model::load_scenario(testing::source_dir() + "/scenarios/gpt-tiny.toml", overrides);
  TrainOptions options;
  options.backend = backend;
  options.steps = kSteps;
  options.threads_per_rank = 0;
  options.trace_step = -2;
  return train_threads(model::build_program(s, model::Granularity::Op), testing::corpus(), options).losses;
}

TEST(CudaTrainingFp8, TinyModelInHybridFollowsTheCpuBackend) {
  TWIN_REQUIRE_GPU();
  const std::string refusal = fp8_gemm_refusal(CudaBackend().compute_capability());
  if (!refusal.empty()) {  // below sm_90 the run is refused by name
    try {
      tiny_fp8_losses("cuda");
      FAIL() << "model.fp8 ran on a GPU below sm_90";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "skipped: " << refusal;
  }
  const auto cpu_losses = tiny_fp8_losses("cpu");
  const auto cuda_losses = tiny_fp8_losses("cuda");
  ASSERT_EQ(cuda_losses.size(), cpu_losses.size());
  for (std::size_t i = 0; i < cpu_losses.size(); ++i) {
    std::printf("[ fp8 ] step %zu loss cpu %.4f cuda %.4f\n", i + 1, cpu_losses[i], cuda_losses[i]);
    EXPECT_NEAR(cuda_losses[i], cpu_losses[i], kStepTolerance * cpu_losses[i]) << "step " << i + 1;
  }
  EXPECT_LT(cuda_losses.back(), cuda_losses.front());
}

}  // namespace
}  // namespace twin::exec::cuda

// Mixture-of-Experts on the CUDA backend (exec/cuda/cuda_backend_moe.cpp; skipped without a GPU but the harness's own
// check): its MoE methods against the CPU backend's on one layer's worth of routing, and a tiny MoE trained on the CUDA
// backend (one rank, and expert parallelism over 2 rank threads sharing the GPU: the all-to-alls staged) following the
// CPU backend's losses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "exec/cpu/cpu_backend.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/train/trainer.hpp"
#include "kernels/cpu/moe.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "tests/exec/cuda/backend_tensors.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels_cuda/cuda_test_util.hpp"

namespace twin::exec::cuda {
namespace {

using kernels::cpu::testing::random_vector;
using kernels::cuda::testing::bf16_rounded;
using kernels::cuda::testing::normalised_error_below;

using test_tensors::make;
Tensor make_i32(Backend& backend, const std::vector<int>& values) {
  Tensor t = backend.allocate(values.size(), DType::I32);
  backend.upload_i32(t, values.data());
  return t;
}
using test_tensors::read;

// One MoE MLP's kernels through a backend, in the interpreter's order (exec/interpreter/moe/moe_layer.cpp): router,
// host bookkeeping from the downloaded choice, permute, grouped GEMMs (an expert may get no rows), unpermute, and back.
struct MoeOutputs {
  std::vector<int> chosen;
  std::vector<std::vector<float>> values;  // probs, scores, y, d_rows, dprobs, dlogits, dx, dweights; then the loss
  double aux_loss = 0;
};

MoeOutputs run_moe(Backend& be, DType act) {
  const int T = 40, E = 6, k = 2, C = 32, F = 48;
  const auto logits_values = bf16_rounded(random_vector(T * E, 1, -2.0f, 2.0f));
  const auto x_values = bf16_rounded(random_vector(T * C, 2));
  const auto w_values = bf16_rounded(random_vector(E * F * C, 3, -0.2f, 0.2f));
  const auto dy_values = bf16_rounded(random_vector(T * C, 4));
  MoeOutputs o;
  const Tensor logits = make(be, logits_values, act), x = make(be, x_values, act), w = make(be, w_values, act);
  const Tensor probs = be.allocate(T * k, DType::F32), chosen = be.allocate(T * k, DType::I32);
  const Tensor scores = be.allocate(T * E, DType::F32);
  be.moe_kernels().moe_topk_softmax_forward(probs, chosen, logits, T, E, k);
  be.moe_kernels().moe_router_scores_forward(scores, logits, T, E);
  o.chosen.resize(T * k);
  be.download_i32(o.chosen.data(), chosen);
  std::vector<float> counts(E);
  std::vector<int> rows(T * k), rows_per_expert(E);
  kernels::cpu::moe_tokens_per_expert(counts.data(), o.chosen.data(), T, E, k);
  kernels::cpu::moe_permutation(rows.data(), rows_per_expert.data(), o.chosen.data(), T, E, k);
  o.aux_loss = be.moe_kernels().moe_aux_loss_forward(scores, counts, T, E, k, T, 1e-2);
  const Tensor row_map = make_i32(be, rows);
  const Tensor permuted = be.allocate(T * k * C, act), up = be.allocate(T * k * F, act);
  be.moe_kernels().moe_permute_forward(permuted, x, row_map, T, C, k);
  be.moe_kernels().moe_grouped_matmul_forward(up, permuted, w, rows_per_expert, C,
                                              F);  // (rows, F): one GEMM per expert
  // the down projection (E, C, F): the same values in another tensor
  const Tensor w_down = make(be, w_values, act);
  const Tensor down = be.allocate(T * k * C, act);
  be.moe_kernels().moe_grouped_matmul_forward(down, up, w_down, rows_per_expert, F, C);
  const Tensor y = be.allocate(T * C, act);
  be.moe_kernels().moe_unpermute_forward(y, down, probs, row_map, T, C, k);
  const Tensor dy = make(be, dy_values, act);
  const Tensor d_rows = be.allocate(T * k * C, act), dprobs = be.allocate(T * k, DType::F32);
  be.moe_kernels().moe_unpermute_backward(d_rows, dprobs, dy, down, probs, row_map, T, C, k);
  const Tensor d_up = be.allocate(T * k * F, act), dw_down = be.zeros(E * F * C, DType::F32);
  be.moe_kernels().moe_grouped_matmul_backward(d_up, dw_down, d_rows, up, w_down, rows_per_expert, F, C);
  const Tensor d_permuted = be.allocate(T * k * C, act), dw = be.zeros(E * F * C, DType::F32);
  be.moe_kernels().moe_grouped_matmul_backward(d_permuted, dw, d_up, permuted, w, rows_per_expert, C, F);
  const Tensor dx = be.allocate(T * C, act);
  be.moe_kernels().moe_permute_backward(dx, d_permuted, row_map, T, C, k);
  const Tensor dlogits = be.allocate(T * E, act);
  be.moe_kernels().moe_router_backward(dlogits, dprobs, probs, chosen, scores, counts, T, E, k,
                                       MoeAuxLoss{double(T), 1e-2, 0.5});
  o.values = {read(be, probs),  read(be, scores),  read(be, y),  read(be, d_rows),
              read(be, dprobs), read(be, dlogits), read(be, dx), read(be, dw)};
  return o;
}

// On any machine: the comparison's sequence on the CPU backend alone passes every size check of the MoE block, and its
// values are finite and deterministic (what the GPU comparison below then holds the CUDA backend to)
TEST(CudaBackendMoe, TheComparisonRunsOnTheCpuBackend) {
  cpu::CpuBackend first_backend, second_backend;
  const MoeOutputs first = run_moe(first_backend, DType::F32);
  const MoeOutputs second = run_moe(second_backend, DType::F32);
  EXPECT_EQ(first.chosen, second.chosen);
  EXPECT_EQ(first.values, second.values);
  EXPECT_GT(first.aux_loss, 0.0);
  for (const std::vector<float>& values : first.values) {
    for (float v : values) ASSERT_TRUE(std::isfinite(v));
  }
  for (std::size_t t = 0; t < first.chosen.size(); t += 2) EXPECT_NE(first.chosen[t], first.chosen[t + 1]);  // top-2
}

TEST(CudaBackendMoe, MoeMethodsMatchCpuBackend) {
  TWIN_REQUIRE_GPU();
  cpu::CpuBackend host_backend;
  CudaBackend gpu_backend;
  const MoeOutputs want = run_moe(host_backend, DType::F32);
  const MoeOutputs got = run_moe(gpu_backend, gpu_backend.activation_dtype());
  EXPECT_EQ(got.chosen, want.chosen);  // the same logits (bf16 values on both sides): the same experts
  EXPECT_NEAR(got.aux_loss, want.aux_loss, 1e-6 * want.aux_loss);
  const char* names[] = {"probs", "scores", "y", "d_rows", "dprobs", "dlogits", "dx", "dweights"};
  const double tolerances[] = {1e-6, 1e-6, 2e-2, 2e-2, 3e-2, 5e-2, 3e-2, 3e-2};  // bf16 GEMMs chained
  for (std::size_t i = 0; i < want.values.size(); ++i) {
    EXPECT_TRUE(normalised_error_below(got.values[i], want.values[i], tolerances[i])) << names[i];
  }
}

// A tiny MoE (4 experts, top-2, one shared expert, the first layer dense) on the CUDA backend against the CPU one: on
// one rank, and with ep = 2 over 2 rank threads sharing the GPU (dispatch and combine all-to-alls, staged).
TEST(CudaTraining, TinyMoeFollowsTheCpuBackendOnOneRankAndWithExpertParallelism) {
  TWIN_REQUIRE_GPU();
  std::string corpus_text;
  for (int i = 0; i < 400; ++i)
    corpus_text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const TextDataset data = text_from_string(corpus_text);
  auto losses = [&](const std::string& backend, int dp, int ep) {
    const std::string toml =
        "[model]\nname = \"moe\"\nlayers = 3\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\ndtype = \"bf16\"\n"
        "experts = 4\ntop_k = 2\nmoe_ffn_hidden = 96\nshared_experts = 1\ndense_layers = 1\n"
        "[parallel]\ndp = " +
        std::to_string(dp) + "\nep = " + std::to_string(ep) +
        "\nmicro_batch = 2\nglobal_batch = 8\n[cluster]\nnode = \"cpu-host\"\n"
        "[training]\nseed = 3\nlearning_rate = 3e-3\nwarmup_steps = 1\ndecay_steps = 10\n";
    const model::Program program = model::build_program(model::parse_scenario(toml, "test"));
    TrainOptions options;
    options.backend = backend;
    options.steps = 8;
    options.threads_per_rank = 1;
    options.trace_step = -2;
    return train_threads(program, data, options);
  };
  const TrainResult cpu_run = losses("cpu", 1, 1);
  const TrainResult cuda_run = losses("cuda", 1, 1);
  const TrainResult split_run = losses("cuda", 2, 2);
  ASSERT_EQ(cuda_run.losses.size(), cpu_run.losses.size());
  ASSERT_EQ(split_run.losses.size(), cpu_run.losses.size());
  for (std::size_t i = 0; i < cpu_run.losses.size(); ++i) {
    EXPECT_NEAR(cuda_run.losses[i], cpu_run.losses[i], 0.02 * cpu_run.losses[i]) << "step " << i;  // bf16 vs fp32
    EXPECT_NEAR(split_run.losses[i], cuda_run.losses[i], 0.02 * cuda_run.losses[i]) << "step " << i;
    EXPECT_NEAR(cuda_run.aux_losses[i], cpu_run.aux_losses[i], 0.1 * cpu_run.aux_losses[i]) << "step " << i;
  }
  EXPECT_LT(cuda_run.losses.back(), cuda_run.losses.front());
}

}  // namespace
}  // namespace twin::exec::cuda

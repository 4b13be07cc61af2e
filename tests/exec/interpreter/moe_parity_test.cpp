// Mixture-of-Experts parity: a tiny MoE (4 layers, the first dense; 4 experts, top-2, one shared expert) trains to
// the same losses, load-balancing losses and gradient norms under every expert-parallel plan as on one rank: EP
// carved out of DP and out of TP (with sequence parallelism), with pipeline stages, ZeRO-1 of the dense and the expert
// gradients (over DP and over the expert-data-parallel ranks), expert tensor parallelism, recompute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "exec/core/errors.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec_test_util.hpp"
#include "tiny_moe.hpp"

namespace twin::exec {
namespace {

using testing::scenario;
using testing::tiny_moe_toml;
using testing::train;

constexpr int kMoeSteps = 4;
constexpr double kMoeTolerance = 1e-5;

TrainResult run_moe(const std::vector<std::string>& sets) {
  TrainOptions options;
  options.steps = kMoeSteps;
  options.comm_timeout_s = 120;
  return train(scenario(tiny_moe_toml(), sets), options);
}

const TrainResult& reference_run() {
  static const TrainResult result = run_moe({});
  return result;
}

using testing::Plan;

double max_relative_difference(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  return worst;
}

class ExecMoeParityTest : public ::testing::TestWithParam<Plan> {};

TEST_P(ExecMoeParityTest, LossesEqualTheSingleRankRun) {
  const Plan& plan = GetParam();
  const TrainResult result = run_moe(plan.sets);
  const TrainResult& one = reference_run();
  ASSERT_EQ(result.losses.size(), one.losses.size());
  ASSERT_EQ(result.aux_losses.size(), one.aux_losses.size());
  for (std::size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_NEAR(result.losses[i], one.losses[i], kMoeTolerance * one.losses[i]) << plan.name << " step " << i;
    EXPECT_NEAR(result.aux_losses[i], one.aux_losses[i], kMoeTolerance * one.aux_losses[i])
        << plan.name << " step " << i;
    EXPECT_NEAR(result.grad_norms[i], one.grad_norms[i], 1e-4 * one.grad_norms[i]) << plan.name << " step " << i;
  }
  std::printf("[ moe parity ] %-26s losses %.7f %.7f %.7f %.7f  aux %.6f  max relative difference %.1e (aux %.1e)\n",
              plan.name, result.losses[0], result.losses[1], result.losses[2], result.losses[3],
              result.aux_losses.back(), max_relative_difference(result.losses, one.losses),
              max_relative_difference(result.aux_losses, one.aux_losses));
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecMoeParityTest,
    ::testing::Values(
        Plan{"dp2_ep2", {"parallel.dp=2", "parallel.ep=2"}},  //
        Plan{"dp4_ep4", {"parallel.dp=4", "parallel.ep=4"}},
        Plan{"tp2_sp_ep2", {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"}},
        Plan{"pp2_dp2_ep2", {"parallel.pp=2", "parallel.dp=2", "parallel.ep=2"}},
        // ZB-H1: the attention's W deferred, the MoE MLP's weight gradients in B
        Plan{"pp2_dp2_ep2_zb_h1", {"parallel.pp=2", "parallel.dp=2", "parallel.ep=2", "parallel.schedule=\"zb-h1\""}},
        // ZB-V: one layer per chunk, the dense one on stage 0's chunk 0, stage 0's chunk 1 the last MoE layer
        Plan{"pp2_v2_dp2_ep2_zb_v",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.dp=2", "parallel.ep=2",
              "parallel.schedule=\"zb-v\""}},
        Plan{"pp2_v2_dp2_ep2_dualpipev",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.dp=2", "parallel.ep=2",
              "parallel.schedule=\"dualpipev\""}},
        // DualPipe: both stages hold every layer (two copies), the experts' gradients summed over the pair too
        Plan{"pp2_v2_dp2_ep2_dualpipe",
             {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.dp=2", "parallel.ep=2",
              "parallel.schedule=\"dualpipe\""}},
        // expert-data-parallel 2: the experts' gradients reduce-scattered over it, the dense ones over dp 4
        Plan{"dp4_ep2_zero1", {"parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=1"}},
        // the Expert group spans TP ranks, the ExpertData group spans DP replicas
        Plan{"tp2_sp_dp2_ep2_zero1",
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.dp=2", "parallel.ep=2",
              "parallel.zero_stage=1"}},
        // no expert parallelism: every rank holds every expert, the ExpertData group is the TP pair
        Plan{"tp2_sp_ep1", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
        Plan{"dp2_ep2_recompute_full", {"parallel.dp=2", "parallel.ep=2", "parallel.recompute=\"full\""}},
        // expert tensor parallelism: each expert's width split over 2 ranks, the rows all-gathered among them
        Plan{"dp2_etp2", {"parallel.dp=2", "parallel.etp=2"}},
        Plan{"tp2_sp_etp2", {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.etp=2"}},
        Plan{"tp2_sp_dp2_ep2_etp2",
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.dp=2", "parallel.ep=2", "parallel.etp=2"}},
        Plan{"dp4_ep2_etp2_pp2_zero1",
             {"parallel.dp=4", "parallel.ep=2", "parallel.etp=2", "parallel.pp=2", "parallel.zero_stage=1"}},
        Plan{"tp2_sp_pp2_dp2_ep4",
             {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2", "parallel.dp=2", "parallel.ep=4"}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

TEST(ExecMoeParity, TheSingleRankRunLearnsAndReportsTheLoadBalancingLoss) {
  const TrainResult& one = reference_run();
  ASSERT_EQ(one.losses.size(), static_cast<std::size_t>(kMoeSteps));
  ASSERT_EQ(one.aux_losses.size(), static_cast<std::size_t>(kMoeSteps));
  std::printf("[ moe parity ] %-26s losses %.7f %.7f %.7f %.7f  aux %.6f\n", "reference (1 rank)", one.losses[0],
              one.losses[1], one.losses[2], one.losses[3], one.aux_losses.back());
  EXPECT_NEAR(one.losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(one.losses.back(), one.losses.front());
  // Perfect balance gives coeff x 1 a layer (E / k x sum_i (k / E)(1 / E) x E = 1): 3 MoE layers, coeff 1e-2. A
  // router that sends every token to the same two experts would give 2 per layer.
  for (double aux : one.aux_losses) {
    EXPECT_GE(aux, 0.03 * 0.999);
    EXPECT_LT(aux, 0.03 * 1.5);
  }
}

TEST(ExecMoeParity, SwigluExpertsAgreeAcrossExpertSplits) {
  // SwiGLU's [gate | up] rows of each expert split over etp rank by rank, as a dense MLP's over TP
  TrainOptions options;
  options.steps = 3;
  const std::vector<std::string> swiglu = {"model.activation=\"swiglu\"", "model.norm=\"rmsnorm\"",
                                           "model.linear_bias=false"};
  const auto one = train(scenario(tiny_moe_toml(), swiglu), options);
  for (const auto& plan : std::vector<std::vector<std::string>>{
           {"parallel.dp=4", "parallel.ep=2", "parallel.etp=2"},
           {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.dp=2", "parallel.ep=4"}}) {
    std::vector<std::string> sets = swiglu;
    sets.insert(sets.end(), plan.begin(), plan.end());
    const auto many = train(scenario(tiny_moe_toml(), sets), options);
    ASSERT_EQ(many.losses.size(), one.losses.size());
    for (std::size_t i = 0; i < one.losses.size(); ++i) {
      EXPECT_NEAR(many.losses[i], one.losses[i], kMoeTolerance * one.losses[i]) << plan.back() << " " << i;
      EXPECT_NEAR(many.aux_losses[i], one.aux_losses[i], kMoeTolerance * one.aux_losses[i]) << plan.back();
    }
  }
  EXPECT_GT(std::abs(one.losses[2] - reference_run().losses[2]), 1e-4) << "SwiGLU experts trained GELU ones";
}

TEST(ExecMoeParity, TheExpertsAndTheLoadBalancingLossChangeTheModel) {
  TrainOptions options;
  options.steps = 2;
  const TrainResult one = reference_run();
  const TrainResult dense = train(scenario(tiny_moe_toml(), {"model.dense_layers=3"}), options);
  const TrainResult no_aux = train(scenario(tiny_moe_toml(), {"model.moe_aux_loss_coeff=0"}), options);
  EXPECT_GT(std::abs(dense.losses[1] - one.losses[1]), 1e-4) << "the MoE layers trained like dense ones";
  EXPECT_GT(std::abs(no_aux.losses[1] - one.losses[1]), 1e-7) << "the load-balancing loss has no gradient";
  EXPECT_TRUE(no_aux.aux_losses.empty() || no_aux.aux_losses[0] == 0);
}

TEST(ExecMoeParity, WhatTheExecutorDoesNotRunIsRefusedByName) {
  TrainOptions options;
  for (const auto& [sets, field] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"parallel.tp=2"}, "parallel.tp = 2 needs parallel.sequence_parallel = true"},
           {{"parallel.cp=2", "framework.attention=\"flash2\"", "framework.cp_comm=\"all_gather\""},
            "parallel.cp = 2: the executor does not combine context parallelism with MoE layers yet"}}) {
    try {
      train(scenario(tiny_moe_toml(), sets), options);
      ADD_FAILURE() << sets.front() << " trained";
    } catch (const RunError& error) {
      EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
    }
  }
  // a backend without MoE kernels at all: check_supported (tests/exec/train/check_supported_test.cpp)
  EXPECT_NO_THROW(refuse_unsupported_moe(scenario(tiny_moe_toml()), "cpu"));
  EXPECT_NO_THROW(refuse_unsupported_moe(scenario(tiny_moe_toml()), "cuda"));  // exec/cuda/cuda_backend_moe.cpp
}

}  // namespace
}  // namespace twin::exec

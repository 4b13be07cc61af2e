// Token dropping (model.capacity_factor > 0): each expert keeps the capacity of its (token, slot) pairs with the
// highest routing probabilities (Megatron-Core's apply_router_token_dropping, drop policy "probs"). The tiny MoE of
// moe_parity_test.cpp at capacity factor 1 (capacity = tokens x k / E: any imbalance drops) drops pairs, and trains
// to the same losses, load-balancing losses and dropped counts under EP, DP x EP, PP x EP and ETP plans as on one
// rank; a capacity no expert fills is dropless bit for bit; what the executor cannot match is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include <fmt/core.h>

#include "exec/core/errors.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec_test_util.hpp"
#include "kernels/cpu/moe.hpp"
#include "tiny_moe.hpp"

namespace twin::exec {
namespace {

using testing::scenario;
using testing::tiny_moe_toml;
using testing::train;
namespace k = kernels::cpu;

constexpr int kCapacitySteps = 3;
constexpr double kCapacityTolerance = 1e-5;

TrainResult run_capacity(std::vector<std::string> sets, double capacity_factor) {
  sets.push_back(fmt::format("model.capacity_factor={}", capacity_factor));
  TrainOptions options;
  options.steps = kCapacitySteps;
  options.comm_timeout_s = 120;
  return train(scenario(tiny_moe_toml(), sets), options);
}

const TrainResult& one_rank_dropping() {
  static const TrainResult result = run_capacity({}, 1.0);
  return result;
}

TEST(ExecMoeCapacity, TheKernelKeepsEachExpertsMostProbablePairs) {
  // 4 tokens, top-2 of 3 experts: expert 0 is chosen by all four, expert 1 by three, expert 2 by one.
  const int experts_chosen[] = {0, 1, 1, 0, 0, 2, 1, 0};
  const float probs[] = {0.6f, 0.4f, 0.7f, 0.3f, 0.5f, 0.5f, 0.7f, 0.3f};
  EXPECT_EQ(k::moe_capacity(4, 3, 2, 1.0), 3);   // ceil(8 / 3)
  EXPECT_EQ(k::moe_capacity(4, 3, 2, 8.0), 4);   // at most every token
  EXPECT_EQ(k::moe_capacity(4, 3, 2, 0.25), 1);  // ceil(2 / 3)
  std::vector<int> kept(std::begin(experts_chosen), std::end(experts_chosen));
  EXPECT_EQ(k::moe_capacity_drop(kept.data(), probs, 4, 3, 2, 2), 3);
  // expert 0: probs 0.6 (t0), 0.3 (t1), 0.5 (t2), 0.3 (t3): keeps t0, t2. Expert 1: 0.4 (t0), 0.7 (t1), 0.7 (t3):
  // keeps t1, t3. Expert 2: t2 alone.
  EXPECT_EQ(kept, (std::vector<int>{0, k::kMoeDropped, 1, k::kMoeDropped, 0, 2, 1, k::kMoeDropped}));
  // a tie: expert 0 of capacity 1 chosen by t0 and t1 with 0.3 alike keeps the earlier token
  const float tied[] = {0.3f, 0.7f, 0.3f, 0.7f};
  std::vector<int> pair = {0, 1, 0, 2};
  EXPECT_EQ(k::moe_capacity_drop(pair.data(), tied, 2, 3, 2, 1), 1);
  EXPECT_EQ(pair, (std::vector<int>{0, 1, k::kMoeDropped, 2}));
  // the permutation gives a dropped pair no row; the experts' rows count only the kept ones
  std::vector<int> rows(8), rows_per_expert(3);
  k::moe_permutation(rows.data(), rows_per_expert.data(), kept.data(), 4, 3, 2);
  EXPECT_EQ(rows_per_expert, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(rows, (std::vector<int>{0, k::kMoeDropped, 2, k::kMoeDropped, 1, 4, 3, k::kMoeDropped}));
  // unpermute: token 1 keeps slot 0 only; its dropped slot gets no probability gradient
  const int hidden = 2;
  std::vector<float> expert_out(5 * hidden);
  std::iota(expert_out.begin(), expert_out.end(), 1.0f);
  std::vector<float> out(4 * hidden, -1.0f);
  k::moe_unpermute_forward(out.data(), expert_out.data(), probs, rows.data(), 4, hidden, 2);
  EXPECT_FLOAT_EQ(out[2], 0.7f * expert_out[2 * hidden]);
  std::vector<float> d_out(4 * hidden, 1.0f), d_rows(8 * hidden, 0.0f), d_probs(8, -1.0f);
  k::moe_unpermute_backward(d_rows.data(), d_probs.data(), d_out.data(), expert_out.data(), probs, rows.data(), 4,
                            hidden, 2);
  EXPECT_EQ(d_probs[1], 0.0f);
  EXPECT_EQ(d_probs[3], 0.0f);
  EXPECT_FLOAT_EQ(d_probs[2], expert_out[2 * hidden] + expert_out[2 * hidden + 1]);
}

TEST(ExecMoeCapacity, CapacityFactorOneDropsTokensAndChangesTraining) {
  const TrainResult& one = one_rank_dropping();
  ASSERT_EQ(one.moe_dropped_slots.size(), static_cast<std::size_t>(kCapacitySteps));
  // 8 micro-batches of 32 tokens, top-2, 3 MoE layers: 1536 pairs a step, capacity 16 per expert and micro-batch
  for (long dropped : one.moe_dropped_slots) {
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, 1536);
  }
  const TrainResult dropless = run_capacity({}, 0);
  EXPECT_TRUE(dropless.moe_dropped_slots.empty());
  for (int i = 0; i < kCapacitySteps; ++i) {  // step 0's forward drops too
    EXPECT_GT(std::abs(one.losses[i] - dropless.losses[i]), 1e-6) << "dropping changed nothing at step " << i;
  }
  std::printf(
      "[ moe capacity ] one rank, capacity factor 1: dropped %ld %ld %ld of 1536 pairs; losses %.7f %.7f "
      "%.7f (dropless %.7f %.7f %.7f)\n",
      one.moe_dropped_slots[0], one.moe_dropped_slots[1], one.moe_dropped_slots[2], one.losses[0], one.losses[1],
      one.losses[2], dropless.losses[0], dropless.losses[1], dropless.losses[2]);
}

using testing::Plan;

class ExecMoeCapacityParityTest : public ::testing::TestWithParam<Plan> {};

TEST_P(ExecMoeCapacityParityTest, DropsAndLossesEqualTheSingleRankRun) {
  const Plan& plan = GetParam();
  const TrainResult result = run_capacity(plan.sets, 1.0);
  const TrainResult& one = one_rank_dropping();
  ASSERT_EQ(result.losses.size(), one.losses.size());
  ASSERT_EQ(result.moe_dropped_slots.size(), one.moe_dropped_slots.size());
  for (std::size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_EQ(result.moe_dropped_slots[i], one.moe_dropped_slots[i]) << plan.name << " step " << i;
    EXPECT_NEAR(result.losses[i], one.losses[i], kCapacityTolerance * one.losses[i]) << plan.name << " step " << i;
    EXPECT_NEAR(result.aux_losses[i], one.aux_losses[i], kCapacityTolerance * one.aux_losses[i])
        << plan.name << " step " << i;
    EXPECT_NEAR(result.grad_norms[i], one.grad_norms[i], 1e-4 * one.grad_norms[i]) << plan.name << " step " << i;
  }
  std::printf("[ moe capacity ] %-14s dropped %ld %ld %ld  losses %.7f %.7f %.7f\n", plan.name,
              result.moe_dropped_slots[0], result.moe_dropped_slots[1], result.moe_dropped_slots[2], result.losses[0],
              result.losses[1], result.losses[2]);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ExecMoeCapacityParityTest,
    ::testing::Values(Plan{"ep2", {"parallel.dp=2", "parallel.ep=2"}},
                      Plan{"dp2_ep2", {"parallel.dp=4", "parallel.ep=2"}},
                      Plan{"pp2_ep2", {"parallel.pp=2", "parallel.dp=2", "parallel.ep=2"}},
                      Plan{"dp2_etp2", {"parallel.dp=2", "parallel.etp=2"}},
                      Plan{"ep2_recompute_full", {"parallel.dp=2", "parallel.ep=2", "parallel.recompute=\"full\""}}),
    [](const ::testing::TestParamInfo<Plan>& plan_info) { return std::string(plan_info.param.name); });

TEST(ExecMoeCapacity, ACapacityNoExpertFillsIsDroplessBitForBit) {
  const TrainResult dropless = run_capacity({"parallel.dp=2", "parallel.ep=2"}, 0);
  const TrainResult roomy = run_capacity({"parallel.dp=2", "parallel.ep=2"}, 8.0);  // capacity = every token
  ASSERT_EQ(roomy.moe_dropped_slots, std::vector<long>(kCapacitySteps, 0));
  ASSERT_EQ(roomy.losses.size(), dropless.losses.size());
  for (std::size_t i = 0; i < dropless.losses.size(); ++i) {
    EXPECT_EQ(roomy.losses[i], dropless.losses[i]) << "step " << i;
    EXPECT_EQ(roomy.aux_losses[i], dropless.aux_losses[i]) << "step " << i;
    EXPECT_EQ(roomy.grad_norms[i], dropless.grad_norms[i]) << "step " << i;
  }
}

TEST(ExecMoeCapacity, WhatTheExecutorCannotMatchIsRefusedByName) {
  TrainOptions options;
  try {
    train(scenario(tiny_moe_toml(), {"model.capacity_factor=1", "parallel.tp=2", "parallel.sequence_parallel=true"}),
          options);
    ADD_FAILURE() << "token dropping under TP trained";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("model.capacity_factor = 1 with parallel.tp = 2: each TP rank drops "
                        "within its own sequence shard"),
              std::string::npos)
        << error.what();
  }
  try {
    refuse_unsupported_moe(scenario(tiny_moe_toml(), {"model.capacity_factor=1.25"}), "cuda");
    ADD_FAILURE() << "token dropping on the cuda backend was not refused";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("model.capacity_factor = 1.25: the cuda backend trains dropless MoE only"),
              std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW(refuse_unsupported_moe(scenario(tiny_moe_toml(), {"model.capacity_factor=1.25"}), "cpu"));
  // Padding to capacity adds zero rows, which change no loss: the executor refuses the key rather than ignore it.
  try {
    refuse_unsupported_moe(scenario(tiny_moe_toml(), {"model.capacity_factor=1.25", "model.pad_to_capacity=true"}),
                           "cpu");
    ADD_FAILURE() << "padding to capacity was not refused";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("model.pad_to_capacity: twin run drops tokens without padding"),
              std::string::npos)
        << error.what();
  }
  // The flex dispatcher moves the same rows to the same experts: refused rather than ignored.
  try {
    refuse_unsupported_moe(
        scenario(tiny_moe_toml(), {"parallel.dp=2", "parallel.ep=2", "framework.moe_dispatcher=\"flex\""}), "cpu");
    ADD_FAILURE() << "the flex dispatcher was not refused";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("framework.moe_dispatcher = \"flex\": twin run exchanges"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace twin::exec

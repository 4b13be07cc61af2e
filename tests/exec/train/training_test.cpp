// Training the tiny model (scenarios/gpt-tiny.toml) on the shipped corpus lowers the loss from ~ln(256) quickly.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

TEST(ExecTraining, TheTinyModelLearnsTheShippedCorpus) {
  const model::Scenario s = model::load_scenario(testing::source_dir() + "/scenarios/gpt-tiny.toml");
  TrainOptions options;
  options.steps = 30;
  options.threads_per_rank = 0;  // this host's cores, as `twin run` would
  const model::Program program = model::build_program(s, model::Granularity::Op);
  options.trace_step = -2;
  const TrainResult result = train_threads(program, testing::corpus(), options);
  const auto& losses = result.losses;
  ASSERT_EQ(losses.size(), 30u);
  std::printf("[ training ] gpt-tiny losses: step 1 %.3f, 10 %.3f, 20 %.3f, 30 %.3f (%.0f tokens/s)\n", losses[0],
              losses[9], losses[19], losses[29], result.tokens_per_s);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(losses.back(), 3.0);
  // steady: each block of 5 steps is below the previous one
  for (std::size_t block = 1; block < 6; ++block) {
    const double before = std::accumulate(losses.begin() + 5 * (block - 1), losses.begin() + 5 * block, 0.0);
    const double now = std::accumulate(losses.begin() + 5 * block, losses.begin() + 5 * (block + 1), 0.0);
    EXPECT_LT(now, before) << "block " << block;
  }
  for (double norm : result.grad_norms) EXPECT_TRUE(std::isfinite(norm));
}

// gpt-tiny with Mixture-of-Experts layers (4 experts, top-2, 2 per EP rank over dp 2): the loss falls as the dense
// model's does, and the load-balancing loss stays near its balanced value (coeff x 1 per MoE layer).
TEST(ExecTraining, TheTinyMoeLearnsTheShippedCorpus) {
  std::vector<model::Override> overrides;
  for (const char* set :
       {"model.experts=4", "model.top_k=2", "model.moe_ffn_hidden=256", "parallel.dp=2", "parallel.ep=2"}) {
    overrides.push_back(model::parse_override(set));
  }
  const model::Scenario s = model::load_scenario(testing::source_dir() + "/scenarios/gpt-tiny.toml", overrides);
  TrainOptions options;
  options.steps = 30;
  options.trace_step = -2;
  const TrainResult result = train_threads(model::build_program(s, model::Granularity::Op), testing::corpus(), options);
  const auto& losses = result.losses;
  ASSERT_EQ(losses.size(), 30u);
  ASSERT_EQ(result.aux_losses.size(), 30u);
  std::printf(
      "[ training ] gpt-tiny MoE losses: step 1 %.3f, 10 %.3f, 20 %.3f, 30 %.3f; load-balancing loss %.4f, "
      "%.4f (%.0f tokens/s)\n",
      losses[0], losses[9], losses[19], losses[29], result.aux_losses[0], result.aux_losses[29], result.tokens_per_s);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(losses.back(), 3.0);
  for (std::size_t block = 1; block < 6; ++block) {
    const double before = std::accumulate(losses.begin() + 5 * (block - 1), losses.begin() + 5 * block, 0.0);
    const double now = std::accumulate(losses.begin() + 5 * block, losses.begin() + 5 * (block + 1), 0.0);
    EXPECT_LT(now, before) << "block " << block;
  }
  for (double aux : result.aux_losses) {  // 4 MoE layers x 1e-2 when balanced; 2x that if all went to two experts
    EXPECT_GE(aux, 0.04 * 0.999);
    EXPECT_LT(aux, 0.04 * 1.5);
  }
}

TEST(ExecTraining, LearningRateFollowsWarmupAndCosineDecay) {
  const auto s =
      testing::scenario(testing::small_toml(), {"training.warmup_steps=4", "training.decay_steps=8",
                                                "training.learning_rate=1e-3", "training.min_learning_rate=1e-4"});
  TrainOptions options;
  options.steps = 10;
  const auto lr = testing::train(s, options).learning_rates;
  EXPECT_NEAR(lr[0], 0.25e-3, 1e-9);
  EXPECT_NEAR(lr[3], 1e-3, 1e-9);
  EXPECT_NEAR(lr[6], 1e-4 + 0.5 * (1 + std::cos(M_PI * 0.5)) * 0.9e-3, 1e-9);
  EXPECT_NEAR(lr[8], 1e-4, 1e-9);
  EXPECT_NEAR(lr[9], 1e-4, 1e-9);
}

}  // namespace
}  // namespace twin::exec

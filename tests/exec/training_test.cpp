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

// The Program carries FP8 for the simulator; the executor says it does not run it, before any step.
TEST(ExecTraining, Fp8IsRefusedByName) {
  const auto s = testing::scenario(testing::small_toml(), {"model.dtype=\"bf16\"", "model.fp8=\"hybrid\""});
  TrainOptions options;
  options.steps = 1;
  try {
    testing::train(s, options);
    FAIL() << "model.fp8 trained";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("model.fp8 = \"hybrid\": the executor does not train in FP8 yet"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace twin::exec

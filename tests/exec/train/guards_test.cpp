// The trainer's guards (exec/train/guards.hpp): a loss spike or a jump of the weights' norm stops the run before a
// checkpoint is built on it; a checkpoint whose weights gave the spike is set aside, the last known-good one is never
// pruned, and the advice of the message (lower the learning rate and run again) resumes from a good checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/core/errors.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;

TEST(ExecGuards, TheLossSpikeGuardComparesWithTheMedianOfTheRecentSteps) {
  TrainingGuards guards(GuardOptions{}, std::log(256.0), {5.0, 4.0, 4.2});  // median 4.2
  EXPECT_FALSE(guards.check_loss(12.5));                                    // < 3 x 4.2 = 12.6
  const auto spike = guards.check_loss(15.0);                               // > 3 x median(5, 4, 4.2, 12.5) = 13.8
  ASSERT_TRUE(spike);
  EXPECT_NE(spike->find("the loss spiked to 15, above 3 x 4.6000, the median of the last 4 steps"), std::string::npos)
      << *spike;
  EXPECT_FALSE(guards.check_loss(std::nan("")));  // a skipped step's: no verdict, not recorded
}

TEST(ExecGuards, TheFirstLossIsComparedWithAUniformGuess) {
  TrainingGuards guards(GuardOptions{}, std::log(256.0), {});
  EXPECT_FALSE(guards.check_loss(5.6));
  TrainingGuards fresh(GuardOptions{}, std::log(256.0), {});
  const auto spike = fresh.check_loss(17.0);  // 3 x 5.545 = 16.6
  ASSERT_TRUE(spike);
  EXPECT_NE(spike->find("ln(vocabulary) = 5.545"), std::string::npos) << *spike;
  TrainingGuards off(GuardOptions{0, 0}, std::log(256.0), {});
  EXPECT_FALSE(off.check_loss(1e9));
}

TEST(ExecGuards, TheWeightGuardStopsAJumpAndANonFiniteNorm) {
  const TrainingGuards guards(GuardOptions{}, std::log(256.0), {});
  EXPECT_FALSE(guards.check_weights(10.0, 19.9));
  ASSERT_TRUE(guards.check_weights(10.0, 20.1));
  EXPECT_NE(guards.check_weights(10.0, 20.1)->find("multiplied the weights' norm by 2.01"), std::string::npos);
  EXPECT_TRUE(guards.check_weights(10.0, INFINITY));
  const TrainingGuards off(GuardOptions{3, 0}, std::log(256.0), {});
  EXPECT_FALSE(off.check_weights(10.0, 1e30));
  EXPECT_TRUE(off.check_weights(10.0, NAN));  // a non-finite norm stops the run whatever the limit
}

class ExecGuardsRun : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("guards"); }
  void TearDown() override { fs::remove_all(dir_); }
  TrainResult train(int steps, const std::vector<std::string>& sets, TrainOptions options = {}) {
    options.steps = steps;
    options.checkpoint_dir = dir_;
    return testing::train(testing::scenario(testing::small_toml(), sets), options);
  }
  std::string dir_;
};

// The run: a good checkpoint at step 4, then a learning rate of 1e30 with a checkpoint after every step and
// only one kept. The update of step 5 is stopped before it is saved; the good checkpoint is the one left, and the
// message's advice (a lower learning rate) resumes from it to the losses of the run that never diverged.
TEST_F(ExecGuardsRun, APoisonedUpdateIsNeverSavedAndTheAdvisedRerunResumesFromTheGoodCheckpoint) {
  TrainOptions clean;
  clean.steps = 6;
  const auto uninterrupted = testing::train(testing::scenario(testing::small_toml()), clean).losses;
  train(4, {});
  TrainOptions every_step;
  every_step.checkpoint_every = 1;
  every_step.keep_checkpoints = 1;
  std::string message;
  try {
    train(8, {"training.learning_rate=1e30"}, every_step);
  } catch (const GuardTripped& error) {
    message = error.what();
  }
  EXPECT_EQ(message.rfind("training diverged at step 5: the update multiplied the weights' norm by ", 0), 0u)
      << message;
  EXPECT_NE(message.find("Lower training.learning_rate (now 1e+30) and run again: it resumes from " + dir_ +
                         "/step-00000004"),
            std::string::npos)
      << message;
  EXPECT_EQ(latest_checkpoint(dir_), step_directory(dir_, 4));
  const TrainResult resumed = train(6, {});
  EXPECT_EQ(resumed.first_step, 4);
  EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 4, uninterrupted.end()));
}

// With the weight guard off, a learning rate of 10 is saved at step 4 and gives a loss of about 1000 at step 5: the
// spike guard stops the run and moves the checkpoint of step 4 aside. The checkpoint of step 3, whose weights gave a
// sane loss, was kept though --keep-checkpoints is 1, and resuming starts from it.
TEST_F(ExecGuardsRun, ALossSpikeSetsAsideTheCheckpointThatCausedItAndTheKnownGoodOneStays) {
  TrainOptions clean;
  clean.steps = 5;
  const auto uninterrupted = testing::train(testing::scenario(testing::small_toml()), clean).losses;
  train(3, {});
  TrainOptions every_step;
  every_step.checkpoint_every = 1;
  every_step.keep_checkpoints = 1;
  every_step.guards.weight_growth_limit = 0;
  std::string message;
  try {
    train(8, {"training.learning_rate=10"}, every_step);
  } catch (const GuardTripped& error) {
    message = error.what();
  }
  EXPECT_EQ(message.rfind("training diverged at step 5: the loss spiked to ", 0), 0u) << message;
  EXPECT_NE(message.find("it resumes from " + dir_ + "/step-00000003"), std::string::npos) << message;
  EXPECT_NE(message.find("was moved to " + dir_ + "/rejected-step-00000004"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_directory(dir_ + "/rejected-step-00000004"));
  EXPECT_EQ(latest_checkpoint(dir_), step_directory(dir_, 3));
  const TrainResult resumed = train(5, {});
  EXPECT_EQ(resumed.first_step, 3);
  EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 3, uninterrupted.end()));
}

TEST_F(ExecGuardsRun, PruningNeverRemovesTheProtectedCheckpoint) {
  TrainOptions every_step;
  every_step.checkpoint_every = 1;
  every_step.keep_checkpoints = 4;
  train(4, {}, every_step);
  prune_checkpoints(dir_, 1, 2);
  EXPECT_TRUE(fs::exists(step_directory(dir_, 2)));
  EXPECT_TRUE(fs::exists(step_directory(dir_, 4)));
  EXPECT_FALSE(fs::exists(step_directory(dir_, 1)));
  EXPECT_FALSE(fs::exists(step_directory(dir_, 3)));
}

}  // namespace
}  // namespace twin::exec

// Checkpoints: resuming continues bit for bit (also after a real SIGKILL of a training process), and a truncated,
// corrupt or foreign checkpoint is refused with a message naming the file and what differs.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "exec/checkpoint.hpp"
#include "exec/errors.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;
using testing::scenario;
using testing::small_toml;
using testing::train;

const std::vector<std::string> kPlan = {"parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1"};

TrainResult train_with_checkpoints(const model::Scenario& s, int steps, const std::string& dir, int every = 0) {
  TrainOptions options;
  options.steps = steps;
  options.checkpoint_dir = dir;
  options.checkpoint_every = every;
  return train(s, options);
}

// The message of the RunError that resuming from `dir` with scenario `s` raises ("" if none).
std::string resume_error(const model::Scenario& s, const std::string& dir, int steps = 4) {
  try {
    train_with_checkpoints(s, steps, dir);
  } catch (const RunError& error) {
    return error.what();
  }
  return "";
}

TEST(ExecCheckpoint, ResumingContinuesBitForBit) {
  const auto s = scenario(small_toml(), kPlan);
  TrainOptions options;
  options.steps = 8;
  const auto uninterrupted = train(s, options).losses;
  const std::string dir = testing::temp_dir("resume");
  const auto first = train_with_checkpoints(s, 4, dir);
  EXPECT_EQ(first.losses, std::vector<double>(uninterrupted.begin(), uninterrupted.begin() + 4));
  EXPECT_TRUE(fs::exists(dir + "/step-00000004/manifest.json"));
  const auto resumed = train_with_checkpoints(s, 8, dir);
  EXPECT_EQ(resumed.first_step, 4);
  EXPECT_EQ(resumed.earlier_losses, first.losses);
  EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 4, uninterrupted.end()));  // exact
  fs::remove_all(dir);
}

TEST(ExecCheckpoint, KeepsTheNewestAndIgnoresIncompleteOnes) {
  const auto s = scenario(small_toml());
  const std::string dir = testing::temp_dir("keep");
  train_with_checkpoints(s, 6, dir, 2);
  EXPECT_FALSE(fs::exists(dir + "/step-00000002"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000004/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000006/manifest.json"));
  fs::remove(dir + "/step-00000006/manifest.json");  // as if killed before the manifest
  EXPECT_EQ(latest_checkpoint(dir)->filename(), "step-00000004");
  const auto resumed = train_with_checkpoints(s, 6, dir, 2);
  EXPECT_EQ(resumed.first_step, 4);
  fs::remove_all(dir);
}

class ExecBrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("broken");
    train_with_checkpoints(scenario(small_toml(), {"parallel.tp=2"}), 2, dir_);
    step_ = dir_ + "/step-00000002";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, step_;
};

TEST_F(ExecBrokenCheckpoint, TruncatedShard) {
  const std::string shard = step_ + "/rank-00001.bin";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint shard '" + shard + "' is truncated"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, CorruptShard) {
  const std::string shard = step_ + "/rank-00000.bin";
  std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
  file.put('\x7f');
  file.close();
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint shard '" + shard + "' is corrupt"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, TruncatedManifest) {
  const std::string manifest = step_ + "/manifest.json";
  fs::resize_file(manifest, 100);
  const std::string message = resume_error(scenario(small_toml(), {"parallel.tp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint manifest '" + manifest + "' is corrupt or truncated"), std::string::npos)
      << message;
}

TEST_F(ExecBrokenCheckpoint, AnotherPlan) {
  const std::string message = resume_error(scenario(small_toml(), {"parallel.pp=2"}), dir_);
  EXPECT_NE(message.find("checkpoint '" + step_ + "' was written by another model, plan or data set"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("parallel.tp: 2 in the checkpoint, 1 now"), std::string::npos) << message;
  EXPECT_NE(message.find("parallel.pp: 1 in the checkpoint, 2 now"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, AnotherModel) {
  const std::string message =
      resume_error(scenario(small_toml(), {"parallel.tp=2", "model.layers=4", "model.hidden=128"}), dir_);
  EXPECT_NE(message.find("model.layers: 2 in the checkpoint, 4 now"), std::string::npos) << message;
  EXPECT_NE(message.find("model.hidden: 64 in the checkpoint, 128 now"), std::string::npos) << message;
}

TEST_F(ExecBrokenCheckpoint, AnotherPositionEmbedding) {  // ALiBi has no wpe: the same buckets would not line up
  const std::string message =
      resume_error(scenario(small_toml(), {"parallel.tp=2", "model.position_embedding=\"alibi\""}), dir_);
  EXPECT_NE(message.find("model.position_embedding: learned in the checkpoint, alibi now"), std::string::npos)
      << message;
}

TEST_F(ExecBrokenCheckpoint, AnotherDataSet) {
  TrainOptions options;
  options.steps = 4;
  options.checkpoint_dir = dir_;
  options.threads_per_rank = 1;
  const auto s = scenario(small_toml(), {"parallel.tp=2"});
  const model::Program program = model::build_program(s, model::Granularity::Op);
  std::string other_text;
  for (int i = 0; i < 200; ++i) other_text += "a different text altogether. ";
  const TextDataset other = text_from_string(other_text, "other.txt");
  std::string message;
  try {
    train_threads(program, other, options);
  } catch (const RunError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("data: the checkpoint was trained on"), std::string::npos) << message;
}

#ifdef TWIN_BINARY
// A real process killed with SIGKILL in the middle of a run resumes from its last complete checkpoint and produces the
// losses an uninterrupted run produces, bit for bit.
TEST(ExecCheckpoint, SigkillThenResumeGivesTheUninterruptedLosses) {
  const std::string dir = testing::temp_dir("sigkill");
  const std::string scenario_file = dir + "/small.toml";
  std::ofstream(scenario_file) << small_toml();
  const std::string data = testing::source_dir() + "/data/corpus.txt";
  auto command = [&](const std::string& checkpoints, const std::string& json) {
    return std::vector<std::string>{
        TWIN_BINARY, "run",    scenario_file,  "--set",     "parallel.tp=2",      "--steps", "60",
        "--data",    data,     "--checkpoint", checkpoints, "--checkpoint-every", "3",       "--threads",
        "1",         "--json", json,           "--quiet"};
  };
  // 1. killed mid-run, as soon as the checkpoint of step 6 is complete
  testing::Child victim(command(dir + "/killed", dir + "/killed.json"), dir + "/killed.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(dir + "/killed/step-00000006/manifest.json") && std::chrono::steady_clock::now() < deadline &&
         victim.running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  victim.kill_now();
  ASSERT_EQ(victim.wait(), 128 + SIGKILL)
      << "the run ended before it could be killed: " << testing::read_text(dir + "/killed.log");
  ASSERT_FALSE(fs::exists(dir + "/killed.json"));
  // 2. resumed to the end
  ASSERT_EQ(testing::run_command(command(dir + "/killed", dir + "/resumed.json"), dir + "/resumed.log"), 0)
      << testing::read_text(dir + "/resumed.log");
  // 3. uninterrupted
  ASSERT_EQ(testing::run_command(command(dir + "/clean", dir + "/clean.json"), dir + "/clean.log"), 0)
      << testing::read_text(dir + "/clean.log");
  const auto resumed = nlohmann::json::parse(testing::read_text(dir + "/resumed.json"));
  const auto clean = nlohmann::json::parse(testing::read_text(dir + "/clean.json"));
  const int first = resumed["first_step"].get<int>();
  EXPECT_GE(first, 6);
  EXPECT_EQ(first % 3, 0);
  const auto all = clean["losses"].get<std::vector<double>>();
  ASSERT_EQ(all.size(), 60u);
  EXPECT_EQ(resumed["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + first, all.end()));
  EXPECT_EQ(resumed["earlier_losses"].get<std::vector<double>>(),
            std::vector<double>(all.begin(), all.begin() + first));
  std::printf(
      "[ checkpoint ] killed after step >= 6, resumed at step %d: %zu losses identical to the uninterrupted run\n",
      first, all.size() - static_cast<std::size_t>(first));
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace twin::exec

// Checkpoints of a context-parallel run: CP ranks hold the same weights (as DP replicas do; under ZeRO each its shard
// of the dp x cp ranks' optimizer state), each writes its shard file, and resuming reads them back: a run of 4 steps
// in one go and one of 2, resumed for 2 more, give the same losses bit for bit. Resuming under another CP size
// re-shards the checkpoint as another TP / PP / DP size is, and trains on as the uninterrupted run does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec_test_util.hpp"
#include "model/program/program.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;
using testing::scenario;
using testing::small_toml;

// Transformer Engine's fused attention, the all_gather exchanges (as tests/exec/interpreter/context_parallel_test.cpp).
const std::vector<std::string> kCpKeys = {"framework.attention=\"flash2\"", "framework.cp_comm=\"all_gather\""};

model::Scenario plan(const std::vector<std::string>& sets) {
  std::vector<std::string> all = kCpKeys;
  all.insert(all.end(), sets.begin(), sets.end());
  return scenario(small_toml(), all);
}

TrainResult train(const model::Scenario& s, int steps, const std::string& dir = {}) {
  TrainOptions options;
  options.steps = steps;
  options.checkpoint_dir = dir;
  options.comm_timeout_s = 120;
  return testing::train(s, options);
}

TEST(ExecContextParallelCheckpoint, ResumingContinuesBitForBit) {
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {"parallel.cp=2", "parallel.dp=2", "parallel.zero_stage=1"},  // Adam's state over the 4 dp x cp ranks
           {"parallel.cp=2", "parallel.tp=2", "parallel.pp=2"}}) {
    const auto s = plan(sets);
    const auto uninterrupted = train(s, 4).losses;
    const std::string dir = testing::temp_dir("cp-resume");
    const auto first = train(s, 2, dir);
    EXPECT_EQ(first.losses, std::vector<double>(uninterrupted.begin(), uninterrupted.begin() + 2));
    const Manifest manifest = read_manifest(fs::path(dir) / "step-00000002");
    EXPECT_EQ(manifest.world_size, model::rank_layout(s).world_size());
    for (const ShardRecord& shard : manifest.shards) {
      EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000002" / shard.file)) << shard.file;
    }
    const auto resumed = train(s, 4, dir);
    EXPECT_EQ(resumed.first_step, 2) << sets[1];
    EXPECT_FALSE(resumed.resharded) << sets[1];
    EXPECT_EQ(resumed.losses, std::vector<double>(uninterrupted.begin() + 2, uninterrupted.end())) << sets[1];
    fs::remove_all(dir);
  }
}

// Another CP size is another plan: the same math in another order, so the resumed losses are the uninterrupted run's
// within the context-parallel parity bound (tests/exec/context_parallel_parity.hpp: 1e-5; the attention's sums run
// in another order under CP). Re-sharded Adam state put in the wrong place would move them by far more (checkpoint_test
// .cpp: zeroed Adam state moves a loss by 0.12).
TEST(ExecContextParallelCheckpoint, AnotherCpSizeIsReshardedAndTrainsOnAsTheUninterruptedRun) {
  const auto written = plan({"parallel.cp=2", "parallel.dp=2", "parallel.zero_stage=1"});
  const auto uninterrupted = train(written, 4).losses;
  struct Case {
    const char* name;
    std::vector<std::string> sets;
    const char* note;
  };
  for (const Case& c : std::vector<Case>{
           {"one rank", {}, "re-sharded from TP 1 x PP 1 x DP 2 x CP 2 (ZeRO 1) to TP 1 x PP 1 x DP 1 (ZeRO 0)"},
           {"cp 4",
            {"parallel.cp=4"},
            "re-sharded from TP 1 x PP 1 x DP 2 x CP 2 (ZeRO 1) to TP 1 x PP 1 x DP 1 x CP 4 (ZeRO 0)"},
           {"cp 2 x tp 2 x dp 2",
            {"parallel.cp=2", "parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=1"},
            "re-sharded from TP 1 x PP 1 x DP 2 x CP 2 (ZeRO 1) to TP 2 x PP 1 x DP 2 x CP 2 (ZeRO 1)"}}) {
    const std::string dir = testing::temp_dir("cp-reshard");
    train(written, 2, dir);
    TrainOptions options;
    options.steps = 4;
    options.checkpoint_dir = dir;
    options.comm_timeout_s = 120;
    std::vector<std::string> notes;
    options.on_note = [&notes](const std::string& note) { notes.push_back(note); };
    const auto resumed = testing::train(plan(c.sets), options);
    EXPECT_TRUE(resumed.resharded) << c.name;
    EXPECT_EQ(resumed.first_step, 2) << c.name;
    EXPECT_NE(std::find(notes.begin(), notes.end(), c.note), notes.end()) << ::testing::PrintToString(notes);
    ASSERT_EQ(resumed.losses.size(), 2u) << c.name;
    for (std::size_t k = 0; k < 2; ++k) {
      EXPECT_NEAR(resumed.losses[k], uninterrupted[2 + k], 1e-5 * uninterrupted[2 + k]) << c.name << " step " << 2 + k;
    }
    // and written under the new plan, back into the first one
    const auto back = train(written, 5, dir);
    EXPECT_TRUE(back.resharded) << c.name;
    EXPECT_EQ(back.first_step, 4) << c.name;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace twin::exec

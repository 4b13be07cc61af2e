// The checkpoint folder's output policy (README "Reliability"): no symbolic link in it is followed out of it. A lock
// file that is a link, a step folder that is a link to a folder elsewhere: the files they point at are never written,
// read or deleted. And a fresh start (--no-resume) is refused where an older run's newer checkpoints would outlive it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/core/errors.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

namespace fs = std::filesystem;
using testing::scenario;
using testing::small_toml;

std::string contents(const fs::path& path) {
  std::stringstream text;
  text << std::ifstream(path, std::ios::binary).rdbuf();
  return text.str();
}

// A complete checkpoint of step `steps` under `dir` (one rank, two steps of the small model: well under a second).
void write_checkpoint(const std::string& dir, int steps, int every = 0) {
  TrainOptions options;
  options.steps = steps;
  options.checkpoint_dir = dir;
  options.checkpoint_every = every;
  testing::train(scenario(small_toml()), options);
}

TEST(ExecCheckpointFolder, ALockFileThatIsALinkIsRefusedAndItsTargetKept) {
  const std::string dir = testing::temp_dir("lock-link");
  const fs::path outside = fs::path(testing::temp_dir("lock-link-outside")) / "precious.txt";
  std::ofstream(outside) << "precious";
  fs::create_symlink(outside, fs::path(dir) / "twin.lock");
  std::string message;
  try {
    const CheckpointLock lock(dir);
  } catch (const RunError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("its lock file '" + dir + "/twin.lock' is a symbolic link"), std::string::npos) << message;
  EXPECT_EQ(contents(outside), "precious");
  // The check before a run names it too.
  EXPECT_THROW(require_writable_checkpoint_directory(dir), RunError);
}

// A step folder that links to a checkpoint elsewhere (a valid one, so that nothing else would set it apart): a run
// writing that step does not write through it, and pruning neither counts it nor deletes through it.
TEST(ExecCheckpointFolder, AStepFolderThatIsALinkIsNeitherWrittenNorPrunedThrough) {
  const std::string outside = testing::temp_dir("step-link-outside");
  write_checkpoint(outside, 1);
  const fs::path outside_step = fs::path(outside) / "step-00000001";
  const std::string manifest = contents(outside_step / "manifest.json");
  const std::string shard = contents(outside_step / "rank-00000.bin");
  ASSERT_FALSE(manifest.empty());

  const std::string dir = testing::temp_dir("step-link");
  fs::create_symlink(outside_step, fs::path(dir) / "step-00000001");
  EXPECT_THROW(require_writable_checkpoint_directory(dir), RunError);  // what twin run checks before step 1
  std::string message;
  try {
    write_checkpoint(dir, 2, 1);  // would write step 1 through the link
  } catch (const RunFailure& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("step-00000001' is a symbolic link: twin writes no checkpoint through it"), std::string::npos)
      << message;
  EXPECT_EQ(contents(outside_step / "manifest.json"), manifest);
  EXPECT_EQ(contents(outside_step / "rank-00000.bin"), shard);

  // Pruning a folder whose newer steps are real: the link is not a checkpoint of this folder, so it is left alone.
  const std::string pruned = testing::temp_dir("step-link-pruned");
  write_checkpoint(pruned, 3, 1);
  fs::create_symlink(outside_step, fs::path(pruned) / "step-00000001");
  prune_checkpoints(pruned, 1);
  EXPECT_TRUE(fs::is_symlink(fs::path(pruned) / "step-00000001"));
  EXPECT_EQ(contents(outside_step / "manifest.json"), manifest);
  EXPECT_EQ(contents(outside_step / "rank-00000.bin"), shard);
  EXPECT_TRUE(fs::exists(fs::path(pruned) / "step-00000003" / "manifest.json"));
  // Nor is it a checkpoint to resume from.
  fs::remove_all(fs::path(pruned) / "step-00000003");
  fs::remove_all(fs::path(pruned) / "step-00000002");
  EXPECT_FALSE(latest_checkpoint(pruned).has_value());
}

TEST(ExecCheckpointFolder, AFreshStartUnderANewerRunsCheckpointsIsRefusedNamingTheStep) {
  const std::string dir = testing::temp_dir("no-resume");
  write_checkpoint(dir, 4, 2);  // steps 2 and 4
  std::string message;
  try {
    require_no_newer_checkpoint(dir, 3);
  } catch (const RunError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("holds a checkpoint of step 4"), std::string::npos) << message;
  EXPECT_NE(message.find("newer than step 3, the first this run writes"), std::string::npos) << message;
  EXPECT_NO_THROW(require_no_newer_checkpoint(dir, 4));  // step 4 is overwritten by the run's own first checkpoint
  EXPECT_NO_THROW(require_no_newer_checkpoint(testing::temp_dir("no-resume-empty"), 1));
}

}  // namespace
}  // namespace twin::exec
